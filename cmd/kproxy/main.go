// Command kproxy is a drop-in replacement for kube-proxy v1.36: same flags,
// same KubeProxyConfiguration file, same endpoints. Flags and configuration
// live in internal/config; the daemon in internal/daemon.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation/field"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/daemon"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the kproxy command and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	defer logs.FlushLogs()
	cmd := newCommand(stdout)
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	if err := cmd.Execute(); err != nil {
		if errors.Is(err, daemon.ErrDisagree) { // explain --verify wrote the report
			printError(stderr, err)
			return 3
		}
		if !errors.Is(err, daemon.ErrNotProxied) { // explain wrote the answer
			printError(stderr, err)
		}
		return 1
	}
	return 0
}

// newCommand builds the cobra command with every flag bound to a config.Loader.
func newCommand(stdout io.Writer) *cobra.Command {
	loader := config.NewLoader()
	var version versionFlag
	cmd := &cobra.Command{
		Use: "kproxy",
		Long: `kproxy is a Kubernetes network proxy that runs on each node, a drop-in
replacement for kube-proxy ` + config.UpstreamVersion + `: it accepts kube-proxy's flags and
KubeProxyConfiguration file and programs the same Service semantics into
nftables, iptables or IPVS.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if version != versionOff {
				return printVersion(stdout, version)
			}
			return runProxy(cmd, loader)
		},
	}
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		// Flag syntax errors show the usage (on stderr), then the error.
		fmt.Fprintln(c.ErrOrStderr(), c.UsageString())
		return err
	})
	fs := cmd.Flags()
	fs.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	loader.AddFlags(fs)
	fs.Var(&version, "version", "--version, --version=raw prints version information and quits; --version=vX.Y.Z... sets the reported version")
	fs.Lookup("version").NoOptDefVal = string(versionOn)
	_ = cmd.MarkFlagFilename("config", "yaml", "yml", "json")
	cmd.AddCommand(newExplainCommand(stdout), newInspectCommand(stdout))
	return cmd
}

// noArgs accepts empty positional arguments only, as upstream.
func noArgs(cmd *cobra.Command, args []string) error {
	for _, a := range args {
		if a != "" {
			return fmt.Errorf("%q does not take any arguments, got %q", cmd.CommandPath(), args)
		}
	}
	return nil
}

// runProxy loads the configuration, sets up logging, then writes the
// config (--write-config-to) or runs the daemon until SIGINT/SIGTERM.
func runProxy(cmd *cobra.Command, loader *config.Loader) error {
	opts, err := loader.Load()
	if opts != nil {
		logWarnings(opts.Warnings)
	}
	if err != nil {
		return err
	}
	logs.InitLogs()
	if err := logsapi.ValidateAndApplyAsField(&opts.Config.Logging, opts.FeatureGate, field.NewPath("logging")); err != nil {
		return fmt.Errorf("initialize logging: %w", err)
	}
	cliflag.PrintFlags(cmd.Flags())
	if opts.WriteConfigTo != "" {
		if err := config.WriteConfig(opts.WriteConfigTo, opts.Config); err != nil {
			return err
		}
		klog.Background().Info("Wrote configuration", "file", opts.WriteConfigTo)
		return nil
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	if err := daemon.Run(ctx, opts); err != nil {
		klog.Background().Error(err, "Error running kproxy")
		return err
	}
	return nil
}

// logWarnings logs the loader's warnings at warning severity, so that
// they stand out (klog's structured API has no warning level).
func logWarnings(warnings []string) {
	for _, w := range warnings {
		klog.Warning(w)
	}
}

// printError prints a failure; a validation failure lists every problem,
// one per line.
func printError(w io.Writer, err error) {
	var verr *config.ValidationError
	if errors.As(err, &verr) {
		noun := "problems"
		if len(verr.Errors) == 1 {
			noun = "problem"
		}
		fmt.Fprintf(w, "Error: invalid configuration (%d %s):\n", len(verr.Errors), noun)
		for _, e := range verr.Errors {
			fmt.Fprintf(w, "  %s\n", e.Error())
		}
		return
	}
	fmt.Fprintf(w, "Error: %v\n", err)
}
