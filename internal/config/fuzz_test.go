package config

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// FuzzLoadConfig feeds arbitrary bytes to the config decoder. Nothing may
// panic, and any file that decodes must default, validate, encode, and
// decode again strictly.
func FuzzLoadConfig(f *testing.F) {
	f.Add([]byte(header + "mode: nftables\n"))
	f.Add([]byte(header + "iptables:\n  masqueradeBit: 40\nmasqueradeBitt: 1\n"))
	f.Add([]byte(`{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","conntrack":{"min":-1}}`))
	f.Add([]byte(header + "logging:\n  vmodule: [{filePattern: x, verbosity: 3}]\n  format: json\nfeatureGates: {AllAlpha: true}\n"))
	f.Add([]byte("kind: KubeProxyConfiguration\n"))
	goldens, _ := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	for _, g := range goldens {
		if data, err := os.ReadFile(g); err == nil {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tm := time.AfterFunc(10*time.Second, func() { panic(fmt.Sprintf("slow input %q", data)) })
		defer tm.Stop()
		cfg, _, err := Decode(data)
		if err != nil {
			return
		}
		Default(cfg)
		_ = Validate(cfg)
		out, err := Encode(cfg)
		if err != nil {
			t.Fatalf("Encode of a decoded config: %v", err)
		}
		if _, warnings, err := Decode(out); err != nil || len(warnings) != 0 {
			t.Fatalf("re-decoding our own output: %v %q\n%s", err, warnings, out)
		}
	})
}
