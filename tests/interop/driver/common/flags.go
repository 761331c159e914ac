package common

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

// Config is the parsed command line.
type Config struct {
	DriverName     string
	RegistryDir    string
	PluginDataDir  string
	ControlFile    string
	Kubeconfig     string
	NodeName       string
	HelperVersion  string
	DisableHealth  bool
	PollIntervalMs int
	CDIDir         string
}

// ParseFlags parses os.Args. helperVersion names the kubeletplugin release of this build.
func ParseFlags(helperVersion string) Config {
	var c Config
	c.HelperVersion = helperVersion
	fs := flag.NewFlagSet(filepath.Base(os.Args[0]), flag.ExitOnError)
	fs.StringVar(&c.DriverName, "driver-name", "interop.kubelet-dra.test", "DRA driver name")
	fs.StringVar(&c.RegistryDir, "registry-dir", "", "plugin registration directory; "+
		"the registration socket is <dir>/<driver-name>-reg.sock")
	fs.StringVar(&c.PluginDataDir, "plugin-data-dir", "", "directory of the DRA socket dra.sock")
	fs.StringVar(&c.ControlFile, "control-file", "", "JSON control file, polled for changes")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "optional kubeconfig; without it an "+
		"in-memory fake client answers the helper's ResourceClaim lookups")
	fs.StringVar(&c.NodeName, "node-name", "", "optional node name passed to the helper")
	fs.BoolVar(&c.DisableHealth, "disable-health", false, "turn the health service off "+
		"(only where the helper has an option for it)")
	fs.IntVar(&c.PollIntervalMs, "poll-interval-ms", 100, "control file poll interval")
	fs.StringVar(&c.CDIDir, "cdi-dir", "", "optional directory the container runtime reads "+
		"CDI specs from; prepare writes one per claim for devices with a device_path")
	version := fs.Bool("version", false, "print the helper version and exit")
	_ = fs.Parse(os.Args[1:])
	if *version {
		fmt.Println(helperVersion)
		os.Exit(0)
	}
	if c.RegistryDir == "" || c.PluginDataDir == "" {
		fmt.Fprintln(os.Stderr, "--registry-dir and --plugin-data-dir are required")
		os.Exit(2)
	}
	// The kubelet needs an absolute endpoint; GetInfo reports the DRA socket path as given.
	for _, p := range []*string{&c.RegistryDir, &c.PluginDataDir} {
		if abs, err := filepath.Abs(*p); err == nil {
			*p = abs
		}
	}
	return c
}
