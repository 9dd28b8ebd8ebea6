// Package controlplane runs a real Kubernetes control plane for the e2e
// testbed: etcd v3.6 and kube-apiserver v1.36, both built by
// tools/build-apiserver.sh (or Debian's etcd 3.4, see EtcdPath), on free
// loopback ports, with token authentication, RBAC, service-account keys, a
// serving certificate from a testbed CA and dual-stack Service ranges
// (addresses.go). No
// controller-manager or scheduler runs: tests create Nodes and
// EndpointSlices themselves (objects.go).
//
// Start returns once /readyz answers (about 3-5 s); Stop ends both
// processes by PID and removes every file Start created. StopAPIServer and
// StartAPIServer (apiserver.go) stop and start kube-apiserver alone, for
// outages; RenewServingCert rotates its serving certificate.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Options configures Start. The zero value is usable.
type Options struct {
	// APIServerBinary is the kube-apiserver to run; default APIServerPath().
	APIServerBinary string
	// EtcdBinary is the etcd to run; default EtcdPath().
	EtcdBinary string
	// BindAddress is where the API server listens; default 127.0.0.1. Use
	// 0.0.0.0 when node namespaces must reach it over the bed's link to the
	// root namespace (AdvertiseAddress4).
	BindAddress netip.Addr
	// ServiceCIDRs are the Service ranges, primary first; default
	// ServiceCIDRs() (dual-stack, IPv4 primary).
	ServiceCIDRs []netip.Prefix
	// Logf, when set, receives progress lines (e.g. testing.T.Logf).
	Logf func(format string, args ...any)
	// Timeout bounds Start; default 60 s.
	Timeout time.Duration
}

// ControlPlane is a running etcd + kube-apiserver.
type ControlPlane struct {
	// URL is the API server, https://127.0.0.1:<Port>.
	URL  string
	Port int
	// Kubeconfig is an admin kubeconfig (group system:masters).
	Kubeconfig string
	// KproxyKubeconfig authenticates as KproxyUser, which holds only the
	// ClusterRole system:node-proxier, like upstream kube-proxy.
	KproxyKubeconfig string
	// AdminToken and KproxyToken are the bearer tokens of those users.
	AdminToken, KproxyToken string
	// CAFile is the testbed CA's certificate, which verifies the API
	// server's serving certificate (as TLSServerName; the kubeconfigs embed
	// it). RenewServingCert issues a new serving certificate from the same CA.
	CAFile string
	// Config and Client talk to the API server as the admin.
	Config *rest.Config
	Client kubernetes.Interface
	// EtcdVersion is the version of the etcd that runs ("3.6.8").
	EtcdVersion string
	// Dir holds the logs, keys and kubeconfigs; removed by Stop.
	Dir string

	opts      Options
	ca        *ca
	etcdURL   string
	etcdDir   string
	etcd      *process
	apiserver *process
}

// Start runs etcd and kube-apiserver and waits until the API server is
// ready and KproxyUser is bound to system:node-proxier. On error nothing is
// left running.
func Start(ctx context.Context, opts Options) (_ *ControlPlane, err error) {
	opts = opts.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	began := time.Now()
	cp := &ControlPlane{opts: opts}
	defer func() {
		if err != nil {
			err = errors.Join(err, cp.Stop())
		}
	}()
	if err := cp.prepareFiles(); err != nil {
		return nil, err
	}
	etcdURL, err := cp.startEtcd()
	if err != nil {
		return nil, err
	}
	if err := cp.startAPIServer(etcdURL); err != nil {
		return nil, err
	}
	if err := cp.connect(ctx); err != nil {
		return nil, err
	}
	if err := cp.bindKproxy(ctx); err != nil {
		return nil, err
	}
	cp.logf("controlplane: kube-apiserver ready at %s after %v (dir %s)", cp.URL, time.Since(began).Round(time.Millisecond), cp.Dir)
	return cp, nil
}

func (o Options) withDefaults() Options {
	if o.APIServerBinary == "" {
		o.APIServerBinary = APIServerPath()
	}
	if o.EtcdBinary == "" {
		o.EtcdBinary = EtcdPath()
	}
	if !o.BindAddress.IsValid() {
		o.BindAddress = netip.MustParseAddr("127.0.0.1")
	}
	if len(o.ServiceCIDRs) == 0 {
		o.ServiceCIDRs = ServiceCIDRs()
	}
	if o.Timeout == 0 {
		o.Timeout = 60 * time.Second
	}
	return o
}

func (cp *ControlPlane) logf(format string, args ...any) {
	if cp.opts.Logf != nil {
		cp.opts.Logf(format, args...)
	}
}

// prepareFiles creates the temporary directories, tokens, token file, CA,
// serving certificate and service-account key.
func (cp *ControlPlane) prepareFiles() error {
	var err error
	if cp.Dir, err = os.MkdirTemp("", "kproxy-controlplane-"); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	// etcd fsyncs on every write: keep its data in memory when possible.
	if cp.etcdDir, err = os.MkdirTemp(memoryDir(), "kproxy-etcd-"); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	if cp.AdminToken, err = newToken(); err != nil {
		return err
	}
	if cp.KproxyToken, err = newToken(); err != nil {
		return err
	}
	if err := writeTokenFile(cp.path("tokens.csv"), cp.AdminToken, cp.KproxyToken); err != nil {
		return err
	}
	cp.CAFile = cp.path("ca.crt")
	if cp.ca, err = newCA(cp.CAFile); err != nil {
		return err
	}
	if err := cp.RenewServingCert(); err != nil {
		return err
	}
	return writeServiceAccountKey(cp.path("sa.key"))
}

// memoryDir is /dev/shm when usable, else the default temporary directory.
func memoryDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return ""
}

func (cp *ControlPlane) path(name string) string { return filepath.Join(cp.Dir, name) }

// Stop ends kube-apiserver, then etcd (by PID: SIGTERM, SIGKILL after a
// grace period) and removes the temporary directories, logs included (see
// SaveLogs). It is safe to call more than once.
func (cp *ControlPlane) Stop() error {
	if cp == nil {
		return nil
	}
	errs := []error{cp.apiserver.stop(5 * time.Second), cp.etcd.stop(5 * time.Second)}
	for _, d := range []string{cp.Dir, cp.etcdDir} {
		if d != "" {
			errs = append(errs, os.RemoveAll(d))
		}
	}
	cp.Dir, cp.etcdDir = "", ""
	return errors.Join(errs...)
}

// SaveLogs copies etcd.log and kube-apiserver.log into dir (created if
// missing), e.g. before Stop when tests failed.
func (cp *ControlPlane) SaveLogs(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("controlplane: save logs: %w", err)
	}
	for _, name := range []string{"etcd.log", "kube-apiserver.log"} {
		b, err := os.ReadFile(cp.path(name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, name), b, 0o644)
		}
		if err != nil {
			return fmt.Errorf("controlplane: save logs: %w", err)
		}
	}
	return nil
}

// Running returns nil while both processes run, else why one has ended
// (kube-apiserver also between StopAPIServer and StartAPIServer).
func (cp *ControlPlane) Running() error {
	for _, p := range []*process{cp.etcd, cp.apiserver} {
		if done, _ := p.exited(); done {
			return p.exitError()
		}
	}
	return nil
}

// LogPaths returns the etcd and kube-apiserver log files (valid until Stop).
func (cp *ControlPlane) LogPaths() (etcd, apiserver string) {
	return cp.path("etcd.log"), cp.path("kube-apiserver.log")
}

// WriteKubeconfig writes a kubeconfig for user (AdminUser or KproxyUser)
// that reaches the API server at host (e.g. AdvertiseAddress4 from a node
// namespace). TLS is verified against TLSServerName, which the serving
// certificate always names. Options.BindAddress must cover host.
func (cp *ControlPlane) WriteKubeconfig(path string, host netip.Addr, user string) error {
	token := cp.AdminToken
	switch user {
	case AdminUser:
	case KproxyUser:
		token = cp.KproxyToken
	default:
		return fmt.Errorf("controlplane: unknown user %q", user)
	}
	server := "https://" + netip.AddrPortFrom(host, uint16(cp.Port)).String()
	return writeKubeconfig(path, server, cp.CAFile, user, token)
}

// restConfig loads the admin kubeconfig.
func (cp *ControlPlane) restConfig() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("controlplane: kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	return cfg, nil
}
