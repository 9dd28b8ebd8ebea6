package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	utilversion "k8s.io/apimachinery/pkg/util/version"

	"github.com/kproxy/kproxy/internal/config"
)

// version is kproxy's version, set at build time with
// -ldflags "-X main.version=v0.1.0"; else taken from the build info.
var version = ""

// reportedVersion is the kube-proxy version kproxy claims compatibility
// with (--version=vX.Y.Z overrides it).
var reportedVersion = config.UpstreamVersion

// versionFlag is --version: a boolean flag that also accepts "raw", and,
// as upstream, "vX.Y.Z" to set the reported upstream version without
// quitting.
type versionFlag string

const (
	versionOff versionFlag = ""
	versionOn  versionFlag = "true"
	versionRaw versionFlag = "raw"
)

func (v *versionFlag) Set(s string) error {
	if s == string(versionRaw) {
		*v = versionRaw
		return nil
	}
	if strings.HasPrefix(s, "v") {
		if err := checkVersionOverride(s, config.UpstreamVersion); err != nil {
			return err
		}
		reportedVersion = s
		*v = versionOff
		return nil
	}
	on, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true, false or raw: %w", err)
	}
	*v = versionOff
	if on {
		*v = versionOn
	}
	return nil
}

// checkVersionOverride accepts s as the reported version when it is a
// semantic version with def's major, minor and patch, as upstream's
// --version=vX.Y.Z does (a pre-release or build suffix may differ).
func checkVersionOverride(s, def string) error {
	if s == def {
		return nil
	}
	got, err := utilversion.ParseSemantic(s)
	if err != nil {
		return err
	}
	want, err := utilversion.ParseSemantic(def)
	if err != nil {
		return err
	}
	if got.Major() != want.Major() || got.Minor() != want.Minor() || got.Patch() != want.Patch() {
		return fmt.Errorf("version %q must match major/minor/patch of default version %q", s, def)
	}
	return nil
}

func (v *versionFlag) String() string {
	if *v == versionOff {
		return "false"
	}
	return string(*v)
}

func (v *versionFlag) Type() string     { return "version" }
func (v *versionFlag) IsBoolFlag() bool { return true }

// kproxyVersion returns the build's version, "(devel)" when unknown.
func kproxyVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// printVersion prints the one-line version, or with "raw" the build details.
func printVersion(w io.Writer, v versionFlag) error {
	_, err := fmt.Fprintf(w, "kproxy version %s (kube-proxy %s compatible)\n", kproxyVersion(), reportedVersion)
	if err != nil || v != versionRaw {
		return err
	}
	_, err = fmt.Fprintf(w, "go: %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if bi, ok := debug.ReadBuildInfo(); ok && err == nil {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" || s.Key == "vcs.time" || s.Key == "vcs.modified" {
				_, err = fmt.Fprintf(w, "%s: %s\n", s.Key, s.Value)
			}
		}
	}
	return err
}
