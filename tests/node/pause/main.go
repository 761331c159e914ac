// Command pause is the node tier's sandbox process: it holds a pod's namespaces until it is
// told to stop, and reaps the orphans that end up as its children (it is PID 1 when the pod
// shares its PID namespace). It plays the part of the upstream pause image's binary, written
// here so that the image is built from no registry; static (no cgo), so the image needs no libc.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every child that has exited; SIGCHLD signals coalesce, so one may stand for many.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
