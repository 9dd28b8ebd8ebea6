//go:build e2e

package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kproxy/kproxy/test/testbed/netbed"
	"github.com/kproxy/kproxy/test/testbed/netbed/echo"
)

// TestRelayFigures compares the userspace mode's relays with the nftables
// mode on the same bed (BENCH_SERVICES × BENCH_ENDPOINTS in the API, the
// `dp` Service to the four real pods): from the client pod, the time of
// one request on a new connection (connect, one line, its reply, close;
// 1000 in a row, p50 and p99), new connections per second with 16 in
// flight for BENCH_DP_SECONDS, the upload rate of one connection sending
// 256 MiB, and kproxy's RSS growth per open connection over 1000 held
// open. Figures are logged ("relay:"), not judged.
//
//	KPROXY_RELAY_BENCH=1 BENCH_SERVICES=1000 go test -tags e2e -run TestRelayFigures -v ./test/bench/
func TestRelayFigures(t *testing.T) {
	if os.Getenv("KPROXY_RELAY_BENCH") == "" {
		t.Skip("relay figures: run with KPROXY_RELAY_BENCH=1 (root)")
	}
	netbed.RequireRoot(t)
	p, err := loadParams()
	if err != nil {
		t.Fatal(err)
	}
	p.kproxyBin = privateCopy(t, p.kproxyBin)
	s := newSuite(t, p)
	s.createBulk(t)
	for _, mode := range []string{"nftables", "userspace"} {
		t.Run(mode, func(t *testing.T) {
			rb := newRunBed(t, p)
			if _, err := rb.start(p.kproxyBin, mode, kubeconfigFor(t, s.cp)); err != nil {
				t.Fatal(err)
			}
			defer rb.stop()
			dst := netip.AddrPortFrom(dpIP, servicePort)
			ns := rb.prober.ns
			deadline := time.Now().Add(2 * time.Minute)
			for ns.Send(context.Background(), echo.Request{Proto: echo.ProtoTCP, Dst: dst}).Kind != echo.KindNone {
				if time.Now().After(deadline) {
					t.Fatalf("%s: dp never answered", mode)
				}
				if err := rb.exited(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			lat := requestLatencies(t, ns, dst, 1000)
			rate := requestRate(t, ns, dst, 16, p.dpLength)
			bulk := uploadRate(t, ns, dst, 256<<20)
			perConn := heldRSS(t, ns, dst, rb.proc.PID(), 1000)
			t.Logf("relay: %s: request on a new connection p50 %.0f µs, p99 %.0f µs; %.0f requests/s on new connections (16 in flight); one connection uploads %.0f MiB/s; RSS %+.1f KiB per open connection",
				mode, us(percentile(lat, 0.5)), us(percentile(lat, 0.99)), rate, bulk, perConn)
		})
	}
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// request does one exchange on a new connection.
func request(dst netip.AddrPort) error {
	c, err := net.DialTimeout("tcp", dst.String(), 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "hello\n"); err != nil {
		return err
	}
	_, err = bufio.NewReader(c).ReadString('\n')
	return err
}

func requestLatencies(t *testing.T, ns *netbed.Netns, dst netip.AddrPort, n int) []time.Duration {
	t.Helper()
	var lat []time.Duration
	err := ns.Do(func() error {
		for range n {
			start := time.Now()
			if err := request(dst); err != nil {
				return err
			}
			lat = append(lat, time.Since(start))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(lat)
	return lat
}

func requestRate(t *testing.T, ns *netbed.Netns, dst netip.AddrPort, workers int, d time.Duration) float64 {
	t.Helper()
	var done, failed atomic.Int64
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			_ = ns.Do(func() error {
				for time.Now().Before(stop) {
					if request(dst) != nil {
						failed.Add(1)
						continue
					}
					done.Add(1)
				}
				return nil
			})
		})
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Logf("relay: %d of %d requests failed", f, f+done.Load())
	}
	return float64(done.Load()) / d.Seconds()
}

// uploadRate sends size bytes in 16 KiB lines on one connection (the echo
// server answers each with a short line, which a reader drains) and
// returns MiB/s until the last reply.
func uploadRate(t *testing.T, ns *netbed.Netns, dst netip.AddrPort, size int) float64 {
	t.Helper()
	line := []byte(strings.Repeat("x", 16<<10-1) + "\n")
	var elapsed time.Duration
	err := ns.Do(func() error {
		c, err := net.DialTimeout("tcp", dst.String(), 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Minute))
		lines := size / len(line)
		read := make(chan error, 1)
		go func() {
			r := bufio.NewReader(c)
			for range lines {
				if _, err := r.ReadString('\n'); err != nil {
					read <- err
					return
				}
			}
			read <- nil
		}()
		start := time.Now()
		for range lines {
			if _, err := c.Write(line); err != nil {
				return err
			}
		}
		if err := <-read; err != nil {
			return err
		}
		elapsed = time.Since(start)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return float64(size) / (1 << 20) / elapsed.Seconds()
}

// heldRSS opens n connections and keeps them (one exchange each), and
// returns kproxy's RSS growth per connection in KiB.
func heldRSS(t *testing.T, ns *netbed.Netns, dst netip.AddrPort, pid, n int) float64 {
	t.Helper()
	before, ok := readStat(pid)
	if !ok {
		t.Fatal("no stat of kproxy")
	}
	var held []*echo.KeepAlive
	defer func() {
		for _, k := range held {
			_ = k.Close()
		}
	}()
	for range n {
		k, err := echo.DialKeepAlive(ns.Do, dst, 2*time.Second)
		if err != nil {
			t.Fatal(fmt.Errorf("connection %d: %w", len(held)+1, err))
		}
		held = append(held, k)
	}
	time.Sleep(time.Second)
	after, _ := readStat(pid)
	return (float64(after.rss) - float64(before.rss)) / 1024 / float64(n)
}
