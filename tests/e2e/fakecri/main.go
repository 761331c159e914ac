// Command fakecri serves the upstream in-memory fake container runtime
// (k8s.io/cri-client/pkg/fake, the one kubemark's tests use) on a unix socket, so that an
// unmodified kubelet runs pods on a machine without a container runtime: sandboxes and
// containers exist only in memory and start at once. It is the one edge of the e2e tier that
// is not the real thing (docs/e2e.md says why).
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	fakeremote "k8s.io/cri-client/pkg/fake"
)

func filesystem(mountpoint string) []*runtimeapi.FilesystemUsage {
	return []*runtimeapi.FilesystemUsage{{
		Timestamp:  time.Now().UnixNano(),
		FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: mountpoint},
		UsedBytes:  &runtimeapi.UInt64Value{Value: 1 << 20},
		InodesUsed: &runtimeapi.UInt64Value{Value: 100},
	}}
}

// exitRequested ends containers on request: a file <namespace>.<pod>.<container> in dir,
// holding an exit code, makes that running container exit with it (the fake runtime's
// containers never end on their own; a terminated pod is what the tests need it for).
func exitRequested(runtime *fakeremote.RemoteRuntime, dir string) {
	for range time.Tick(200 * time.Millisecond) {
		entries, _ := os.ReadDir(dir)
		for _, entry := range entries {
			path := filepath.Join(dir, entry.Name())
			raw, err := os.ReadFile(path)
			if err != nil {
				continue
			}
			code, err := strconv.Atoi(strings.TrimSpace(string(raw)))
			if err != nil {
				code = 1
			}
			if exitContainer(runtime, entry.Name(), int32(code)) {
				_ = os.Remove(path)
			}
		}
	}
}

func exitContainer(runtime *fakeremote.RemoteRuntime, key string, code int32) bool {
	runtime.RuntimeService.Lock()
	defer runtime.RuntimeService.Unlock()
	for _, c := range runtime.RuntimeService.Containers {
		name := c.Labels["io.kubernetes.pod.namespace"] + "." + c.Labels["io.kubernetes.pod.name"] +
			"." + c.Labels["io.kubernetes.container.name"]
		if name != key || c.State != runtimeapi.ContainerState_CONTAINER_RUNNING {
			continue
		}
		c.State = runtimeapi.ContainerState_CONTAINER_EXITED
		c.ExitCode = code
		c.Reason = "Error"
		c.FinishedAt = time.Now().UnixNano()
		return true
	}
	return false
}

func main() {
	listen := flag.String("listen", "", "unix socket path to serve on")
	mountpoint := flag.String("fs-mountpoint", "/", "mount point reported for the image and container filesystems")
	exitDir := flag.String("exit-dir", "", "directory of exit requests (see exitRequested); empty: none")
	flag.Parse()
	if *listen == "" {
		fmt.Fprintln(os.Stderr, "fakecri: --listen is required")
		os.Exit(2)
	}
	_ = os.Remove(*listen)

	runtime := fakeremote.NewFakeRemoteRuntime()
	// The kubelet takes its cgroup driver from the runtime when the runtime says which.
	runtime.RuntimeService.FakeLinuxConfiguration = &runtimeapi.LinuxRuntimeConfiguration{
		CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS,
	}
	// The kubelet refuses an image without a size (ImageInspectError), and its image
	// garbage collector needs filesystem stats with a mount point.
	runtime.ImageService.SetFakeImageSize(1 << 20)
	runtime.ImageService.SetFakeFilesystemUsage(filesystem(*mountpoint))
	runtime.ImageService.SetFakeContainerFilesystemUsage(filesystem(*mountpoint))
	if err := runtime.Start("unix://" + *listen); err != nil {
		fmt.Fprintln(os.Stderr, "fakecri:", err)
		os.Exit(1)
	}
	fmt.Println("fakecri: serving on", *listen)

	if *exitDir != "" {
		go exitRequested(runtime, *exitDir)
	}
	// The fakes append every call to a slice: trim it so a long run stays flat in memory.
	go func() {
		for range time.Tick(time.Minute) {
			runtime.RuntimeService.Lock()
			runtime.RuntimeService.Called = runtime.RuntimeService.Called[:0]
			runtime.RuntimeService.Unlock()
			runtime.ImageService.Lock()
			runtime.ImageService.Called = runtime.ImageService.Called[:0]
			runtime.ImageService.Unlock()
		}
	}()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
	runtime.Stop()
}
