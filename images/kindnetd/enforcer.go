package main

import (
	"bytes"
	"fmt"
	"log"
	"net/netip"
	"os/exec"
	"time"
)

// resyncPeriod bounds how long a change can wait if a wake-up is missed, and paces retries after a
// failed nft run.
const resyncPeriod = 2 * time.Second

// enforcer keeps the nftables table in step with the cached pods, namespaces and policies.
type enforcer struct {
	nodeIP     netip.Addr
	pods       *cache[pod]
	namespaces *cache[namespace]
	policies   *cache[networkPolicy]
	apply      func(script string) error
	applied    string // the script last applied successfully
}

// sync renders the current state and applies it when it differs from what was applied. Until every
// cache has listed once it does nothing, so a restart keeps the previous process's table in force.
func (e *enforcer) sync() error {
	pods, podsOK := e.pods.snapshot()
	namespaces, nsOK := e.namespaces.snapshot()
	policies, npOK := e.policies.snapshot()
	if !podsOK || !nsOK || !npOK {
		return nil
	}
	rs := compile(pods, namespaces, policies, e.nodeIP)
	script := rs.render()
	if script == e.applied {
		return nil
	}
	if err := e.apply(script); err != nil {
		return err
	}
	e.applied = script
	log.Printf("netpol: applied table inet %s: %d pod chains from %d policies", nftTable, len(rs.Chains), len(policies))
	return nil
}

// runNetworkPolicy starts the watches and enforces until the process ends. The table is left in place on
// exit: the next kindnetd replaces it once it has listed everything, so a restart never opens a gap.
func runNetworkPolicy(api *apiClient, hostIP netip.Addr) {
	changed := make(chan struct{}, 1)
	e := &enforcer{
		nodeIP:     hostIP,
		pods:       newCache[pod]("/api/v1/pods", changed),
		namespaces: newCache[namespace]("/api/v1/namespaces", changed),
		policies:   newCache[networkPolicy]("/apis/networking.k8s.io/v1/networkpolicies", changed),
		apply:      applyNft,
	}
	go e.pods.run(api)
	go e.namespaces.run(api)
	go e.policies.run(api)
	ticker := time.NewTicker(resyncPeriod)
	defer ticker.Stop()
	for {
		select {
		case <-changed:
		case <-ticker.C:
		}
		if err := e.sync(); err != nil {
			log.Printf("netpol: %v (keeping the previous table, retrying)", err)
		}
	}
}

// applyNft loads a script in one transaction: nft applies all of it or none of it.
func applyNft(script string) error {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = bytes.NewBufferString(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft -f -: %v: %s", err, bytes.TrimSpace(out))
	}
	return nil
}
