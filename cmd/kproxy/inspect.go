package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kproxy/kproxy/internal/explain"
	"github.com/kproxy/kproxy/internal/inspect"
)

// defaultDebugAddress is where `kproxy inspect` looks when --address is
// not given (the port the README suggests for --debug-bind-address).
const defaultDebugAddress = "127.0.0.1:10259"

// newInspectCommand is `kproxy inspect`: the state of the kproxy running on
// this node, read from its debug endpoint.
func newInspectCommand(stdout io.Writer) *cobra.Command {
	var addr, output string
	var watch bool
	var interval time.Duration
	cmd := &cobra.Command{
		Use:   "inspect [--address 127.0.0.1:10259] [-o json] [--watch]",
		Short: "Show what the kproxy running on this node programmed",
		Long: `inspect reads the debug endpoint of the kproxy running on this node (started with
--debug-bind-address, a loopback address) and prints its Services with their frontends
and endpoints (state, * for this node's), the endpoints each traffic policy uses, the
last sync (when, how long, full or partial, why, its error), the pending changes and the
drift repairs. --watch prints it again every --interval.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("--output %q: want text or json", output)
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			for {
				st, err := inspect.Fetch(ctx, addr)
				if err != nil {
					return err
				}
				if output == "json" {
					err = explain.WriteJSONValue(stdout, st)
				} else {
					err = inspect.WriteTable(stdout, st)
				}
				if err != nil || !watch {
					return err
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(interval):
				}
				fmt.Fprintln(stdout)
			}
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&addr, "address", defaultDebugAddress, "The debug endpoint of the running kproxy (its --debug-bind-address).")
	fs.StringVarP(&output, "output", "o", "text", "Output format: text or json.")
	fs.BoolVarP(&watch, "watch", "w", false, "Print the state again every --interval until interrupted.")
	fs.DurationVar(&interval, "interval", 2*time.Second, "How often --watch prints.")
	return cmd
}
