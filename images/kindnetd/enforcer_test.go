package main

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// syncedCache fills a cache as a completed list would.
func syncedCache[T kubeObject](items ...T) *cache[T] {
	c := newCache[T]("/test", make(chan struct{}, 1))
	for _, item := range items {
		c.items[objectKey(item.meta())] = item
	}
	c.synced = true
	return c
}

func TestEnforcerAppliesOnChangeAndRetries(t *testing.T) {
	var applied []string
	failNext := false
	e := &enforcer{
		nodeIP:     netip.MustParseAddr(testNode),
		pods:       newCache[pod]("/api/v1/pods", make(chan struct{}, 1)),
		namespaces: syncedCache(testNamespaces...),
		policies:   syncedCache[networkPolicy](),
		apply: func(script string) error {
			if failNext {
				failNext = false
				return errors.New("nft: boom")
			}
			applied = append(applied, script)
			return nil
		},
	}
	if err := e.sync(); err != nil || len(applied) != 0 {
		t.Fatalf("applied before the pods were listed: %v %d", err, len(applied))
	}
	e.pods = syncedCache(testPods(t)...)
	if err := e.sync(); err != nil || len(applied) != 1 || strings.Contains(applied[0], "elements") {
		t.Fatalf("startup without policies should install an empty table: %v %q", err, applied)
	}
	if err := e.sync(); err != nil || len(applied) != 1 {
		t.Fatalf("unchanged state applied again: %v %d", err, len(applied))
	}
	deny := testPolicy(t, "a", "deny", `{"podSelector":{}}`)
	e.policies = syncedCache(deny)
	failNext = true
	if err := e.sync(); err == nil || len(applied) != 1 {
		t.Fatalf("failed apply: %v %d", err, len(applied))
	}
	if err := e.sync(); err != nil || len(applied) != 2 || !strings.Contains(applied[1], "jump ingress_a_web") {
		t.Fatalf("retry after a failed apply: %v %d", err, len(applied))
	}
	e.policies = syncedCache[networkPolicy]()
	if err := e.sync(); err != nil || len(applied) != 3 || applied[2] != applied[0] {
		t.Fatalf("deleting every policy should restore the empty table: %v %d", err, len(applied))
	}
}
