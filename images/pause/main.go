// Command pause is the sandbox ("infra") container of every pod: it holds the pod's namespaces open,
// reaps orphaned children when it is the pod's init process, and exits cleanly on SIGINT/SIGTERM.
// Built as a static binary so the image needs nothing else.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

const version = "shadow-operator-pause 1.0"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println(version)
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "warning: pause should be the first process")
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		fmt.Fprintf(os.Stderr, "shutting down, got signal %v\n", sig)
		os.Exit(0)
	}
}

// reap collects every exited child without blocking; with a shared PID namespace orphans land here.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
