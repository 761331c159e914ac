// Command grafana-dashboard-check reads Grafana dashboard JSON files with Grafana's own
// dashboard types (github.com/grafana/grafana-foundation-sdk/go, generated from the
// dashboard schema Grafana itself publishes) and reports what they refuse.
//
// For each file it decodes the dashboard strictly (an unknown or mistyped field is an
// error, down to each panel's options and field config, typed per panel plugin, and each
// query, typed per data source), then runs the types' own Validate. The export envelope
// that Grafana's import consumes (__inputs, __requires, __elements) is not part of the
// schema and is set aside first.
//
// Exit status: 0 when every file passes, 1 when one does not (one "file: path: message"
// line per problem), 2 on a usage or read error.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// exportKeys are written by Grafana's "Export for sharing externally" and read by its
// import; the dashboard schema does not know them.
var exportKeys = []string{"__inputs", "__requires", "__elements"}

func check(path string) ([]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return []string{fmt.Sprintf("not a JSON object: %v", err)}, nil
	}
	for _, key := range exportKeys {
		delete(fields, key)
	}
	body, err := json.Marshal(fields)
	if err != nil {
		return nil, err
	}
	var board dashboard.Dashboard
	if err := board.UnmarshalJSONStrict(body); err != nil {
		return messages(err), nil
	}
	if err := board.Validate(); err != nil {
		return messages(err), nil
	}
	return nil, nil
}

func messages(err error) []string {
	var build cog.BuildErrors
	if errors.As(err, &build) {
		out := make([]string, 0, len(build))
		for _, e := range build {
			out = append(out, e.Error())
		}
		return out
	}
	return []string{err.Error()}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: grafana-dashboard-check DASHBOARD.json...")
		os.Exit(2)
	}
	plugins.RegisterDefaultPlugins()
	status := 0
	for _, path := range os.Args[1:] {
		problems, err := check(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			os.Exit(2)
		}
		for _, p := range problems {
			fmt.Printf("%s: %s\n", path, p)
		}
		if len(problems) > 0 {
			status = 1
			continue
		}
		fmt.Printf("%s: ok\n", path)
	}
	os.Exit(status)
}
