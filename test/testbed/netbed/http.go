package netbed

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// HTTPClient returns an HTTP client whose connections are opened inside the
// namespace (for kproxy's /healthz and /metrics, which listen there). It
// keeps no idle connections, and each request is bounded by timeout.
func (n *Netns) HTTPClient(timeout time.Duration) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := n.Do(func() error {
			var err error
			conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
	return &http.Client{
		Timeout:   timeout,
		Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true, Proxy: nil},
	}
}

// HTTPGet fetches url from inside the namespace (5 s bound) and returns the
// status code and up to 1 MiB of body.
func (n *Netns) HTTPGet(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := n.HTTPClient(5 * time.Second).Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("netbed: GET %s in %s: %w", url, n.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(body), err
}
