package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/logs"
	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/config"
	"github.com/kproxy/kproxy/internal/daemon"
	"github.com/kproxy/kproxy/internal/explain"
	"github.com/kproxy/kproxy/internal/inspect"
)

// newExplainCommand is `kproxy explain`: the path of one new connection on
// a node, from the Services of the API (--kubeconfig, --master, --config) or
// of --source-file, with every daemon flag meaning what it means there.
func newExplainCommand(stdout io.Writer) *cobra.Command {
	loader := config.NewLoader()
	var from, to, node, output, debugAddr string
	var verify bool
	cmd := &cobra.Command{
		Use:   "explain --from IP --to IP:PORT[/tcp|udp|sctp] [--node NAME]",
		Short: "Explain where a new connection to a Service goes on a node, and why",
		Long: `explain prints the path a new connection from --from to --to takes on a node:
the frontend that matches (ClusterIP, NodePort, LoadBalancer ingress IP, external IP) or
that none does, each policy applied with its reason, the endpoints it may go to with their
probabilities, the ones left out and why, whether it is masqueraded, or that it is
dropped or rejected. The Services come from the API (--kubeconfig, --master, --config)
or from --source-file; the node is --node (or --hostname-override, or this host's name).
The answer is computed from the same model the dataplanes program. Exit status 1 when no
Service frontend takes the packet, or the request cannot be answered.

With --verify, run on the node (nftables or iptables mode), the same packet is also traced
through the rules the kernel holds, read back over netlink (nftables) or with iptables-save,
and through the rules kproxy renders for the same Services; every difference on the
packet's path is listed (a rule or element deleted or added by hand, another proxy's
stale rules, an endpoint the kernel still sends to). Exit status 3 when they differ.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := explainRequest(from, to)
			if err != nil {
				return err
			}
			if output != "text" && output != "json" {
				return fmt.Errorf("--output %q: want text or json", output)
			}
			if debugAddr != "" && verify {
				return errors.New("--verify reads the Services itself: leave out --debug-address")
			}
			if debugAddr != "" {
				return explainLive(cmd.Context(), debugAddr, req, stdout, output == "json")
			}
			if node != "" {
				if err := cmd.Flags().Set("hostname-override", node); err != nil {
					return err
				}
			}
			opts, err := loader.Load()
			if err != nil {
				return err
			}
			logs.InitLogs()
			if opts.Config.Logging.Verbosity == 0 {
				// The daemon's start-up lines are noise here: errors
				// only, unless -v asks for more.
				klog.LogToStderr(false)
				klog.SetOutput(io.Discard)
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ctx = klog.NewContext(ctx, klog.Background())
			return daemon.Explain(ctx, opts, req, stdout, output == "json", verify)
		},
	}
	fs := cmd.Flags()
	fs.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	loader.AddFlags(fs)
	fs.StringVar(&from, "from", "", "The client's address.")
	fs.StringVar(&to, "to", "", "The destination, IP:PORT[/tcp|udp|sctp] ([IP]:PORT for IPv6); tcp when left out.")
	fs.StringVar(&node, "node", "", "The node to explain for (default: --hostname-override, or this host's name).")
	fs.StringVarP(&output, "output", "o", "text", "Output format: text or json.")
	fs.BoolVar(&verify, "verify", false, "Also trace the packet through this node's kernel rules and report every difference from kproxy's (exit status 3).")
	fs.StringVar(&debugAddr, "debug-address", "", "Ask the kproxy running on this node (its --debug-bind-address, e.g. 127.0.0.1:10259) instead: the answer comes from what it last programmed.")
	return cmd
}

// explainLive has the running kproxy answer from its live snapshot.
func explainLive(ctx context.Context, addr string, req explain.Request, out io.Writer, asJSON bool) error {
	if ctx == nil {
		ctx = context.Background()
	}
	a, err := inspect.Explain(ctx, addr, req)
	if err != nil {
		return err
	}
	if asJSON {
		err = explain.WriteJSON(out, a)
	} else {
		err = explain.WriteText(out, a)
	}
	if err == nil && a.Verdict == explain.NotProxied {
		return daemon.ErrNotProxied
	}
	return err
}

func explainRequest(from, to string) (explain.Request, error) {
	if from == "" || to == "" {
		return explain.Request{}, errors.New("explain needs --from IP and --to IP:PORT[/protocol]")
	}
	src, err := netip.ParseAddr(from)
	if err != nil {
		return explain.Request{}, fmt.Errorf("--from %q: not an IP address", from)
	}
	dst, proto, err := explain.ParseTo(to)
	if err != nil {
		return explain.Request{}, fmt.Errorf("--to %w", err)
	}
	return explain.Request{From: src.Unmap(), To: dst, Protocol: proto}, nil
}
