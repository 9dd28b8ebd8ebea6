package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Version is the kube-apiserver version tools/build-apiserver.sh builds.
const Version = "v1.36.3"

// TLSServerName is a name the API server's self-signed certificate always
// holds, whatever address a client dials.
const TLSServerName = "kubernetes.default.svc"

// APIServerPath is where tools/build-apiserver.sh puts kube-apiserver (and,
// beside it, upstream kube-proxy and etcd):
// $KPROXY_APISERVER if set, else
// ${KPROXY_CACHE:-$HOME/.cache/kproxy}/bin/<Version>/kube-apiserver.
func APIServerPath() string {
	if p := os.Getenv("KPROXY_APISERVER"); p != "" {
		return p
	}
	cache := os.Getenv("KPROXY_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "kproxy")
	}
	return filepath.Join(cache, "bin", Version, "kube-apiserver")
}

// EtcdPath is the etcd the testbed runs, chosen by $KPROXY_ETCD:
//   - unset or empty: ${KPROXY_CACHE:-$HOME/.cache/kproxy}/bin/<Version>/etcd,
//     etcd v3.6 built by tools/build-apiserver.sh (what kubeadm 1.36 runs;
//     kube-apiserver serves watch-list requests against it);
//   - "debian": "etcd" from PATH, Debian's etcd-server 3.4, older than the
//     3.4.31 whose progress notifications watch-list needs, so the API
//     server refuses watch-list and clients fall back to a LIST;
//   - anything else: the etcd binary at that path.
func EtcdPath() string {
	switch p := os.Getenv("KPROXY_ETCD"); p {
	case "":
		return filepath.Join(filepath.Dir(APIServerPath()), "etcd")
	case "debian":
		return "etcd"
	default:
		return p
	}
}

// EtcdVersion runs bin --version and returns the version it prints
// ("3.6.8").
func EtcdVersion(bin string) (string, error) {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("controlplane: %s --version: %w", bin, err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "etcd Version: "); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("controlplane: %s --version: no version in %q", bin, out)
}

// startEtcd runs a single-member etcd on two free loopback ports and
// returns its client URL.
func (cp *ControlPlane) startEtcd() (string, error) {
	ports, err := freePorts(netip.MustParseAddr("127.0.0.1"), 2)
	if err != nil {
		return "", err
	}
	if cp.EtcdVersion, err = EtcdVersion(cp.opts.EtcdBinary); err != nil {
		return "", err
	}
	client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	cp.etcd, err = startProcess("etcd", cp.path("etcd.log"), cp.opts.EtcdBinary,
		"--name=testbed",
		"--data-dir="+cp.etcdDir,
		"--listen-client-urls="+client,
		"--advertise-client-urls="+client,
		"--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer,
		"--initial-cluster=testbed="+peer,
		"--initial-cluster-state=new",
	)
	if err != nil {
		return "", err
	}
	cp.logf("controlplane: etcd %s (%s) pid %d at %s", cp.EtcdVersion, cp.opts.EtcdBinary, cp.etcd.cmd.Process.Pid, client)
	return client, nil
}

// startAPIServer runs kube-apiserver against etcdURL, on a free port the
// first time and on the same port after that.
func (cp *ControlPlane) startAPIServer(etcdURL string) error {
	if cp.Port == 0 {
		ports, err := freePorts(cp.opts.BindAddress, 1)
		if err != nil {
			return err
		}
		cp.Port = ports[0]
		cp.URL = "https://127.0.0.1:" + strconv.Itoa(cp.Port)
	}
	cp.etcdURL = etcdURL
	var ranges []string
	for _, p := range cp.opts.ServiceCIDRs {
		ranges = append(ranges, p.String())
	}
	var err error
	cp.apiserver, err = startProcess("kube-apiserver", cp.path("kube-apiserver.log"), cp.opts.APIServerBinary,
		"--etcd-servers="+etcdURL,
		"--bind-address="+cp.opts.BindAddress.String(),
		"--secure-port="+strconv.Itoa(cp.Port),
		"--advertise-address="+AdvertiseAddress4.String(),
		"--tls-cert-file="+cp.path(servingCertFile),
		"--tls-private-key-file="+cp.path(servingKeyFile),
		"--token-auth-file="+cp.path("tokens.csv"),
		"--authorization-mode=RBAC",
		// As kubeadm sets it: kube-proxy's DaemonSet (and deploy/) is privileged.
		"--allow-privileged=true",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+cp.path("sa.key"),
		"--service-account-signing-key-file="+cp.path("sa.key"),
		"--service-cluster-ip-range="+strings.Join(ranges, ","),
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	)
	if err != nil {
		return err
	}
	cp.logf("controlplane: kube-apiserver pid %d at %s", cp.apiserver.cmd.Process.Pid, cp.URL)
	return nil
}

// connect waits for /readyz, then writes the kubeconfigs and builds the
// admin client.
func (cp *ControlPlane) connect(ctx context.Context) error {
	if err := cp.waitReady(ctx); err != nil {
		return err
	}
	cp.Kubeconfig = cp.path("admin.kubeconfig")
	cp.KproxyKubeconfig = cp.path("kproxy.kubeconfig")
	if err := writeKubeconfig(cp.Kubeconfig, cp.URL, cp.CAFile, AdminUser, cp.AdminToken); err != nil {
		return err
	}
	if err := writeKubeconfig(cp.KproxyKubeconfig, cp.URL, cp.CAFile, KproxyUser, cp.KproxyToken); err != nil {
		return err
	}
	cfg, err := cp.restConfig()
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("controlplane: clientset: %w", err)
	}
	cp.Config, cp.Client = cfg, cs
	return nil
}

// waitReady polls /readyz until it answers ok, a process ends, or ctx ends.
func (cp *ControlPlane) waitReady(ctx context.Context) error {
	client := insecureClient(cp.AdminToken)
	var last error
	for {
		for _, p := range []*process{cp.etcd, cp.apiserver} {
			if done, _ := p.exited(); done {
				return p.exitError()
			}
		}
		if last = probe(ctx, client, cp.URL+"/readyz"); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("controlplane: kube-apiserver not ready: %w (last: %w)\n--- kube-apiserver log (tail) ---\n%s",
				ctx.Err(), last, cp.apiserver.logTail(3000))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// bindKproxy binds KproxyUser to the bootstrap ClusterRole
// system:node-proxier (which the API server creates before it is ready).
func (cp *ControlPlane) bindKproxy(ctx context.Context) error {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kproxy:node-proxier"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: NodeProxierRole},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: KproxyUser}},
	}
	_, err := cp.Client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("controlplane: bind %s to %s: %w", KproxyUser, NodeProxierRole, err)
	}
	return nil
}

// freePorts returns n distinct ports that are free on addr right now.
func freePorts(addr netip.Addr, n int) ([]int, error) {
	var ports []int
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		if err != nil {
			return nil, fmt.Errorf("controlplane: free port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	if len(ports) != n {
		return nil, errors.New("controlplane: no free ports")
	}
	return ports, nil
}
