// Command gatehouse-pause is the local cluster's pod sandbox ("pause")
// process: it holds a pod's namespaces, reaps orphaned children, and exits
// on SIGINT or SIGTERM. Like the upstream pause, `-v` prints its version
// and exits: kubeadm upgrade apply's health check runs a Job of the pause
// image with that argument and waits for it to complete. It is built into the pause image that `gatehouse
// mini up` imports into every node's containerd, so nothing is pulled.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("gatehouse-pause")
		return
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
