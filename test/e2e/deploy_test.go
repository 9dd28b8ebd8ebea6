//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	authzv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

	"github.com/kproxy/kproxy/internal/config"
)

// deployDir holds the manifests operators apply (README, "Operating kproxy").
const deployDir = "../../deploy"

// TestDeployManifests checks deploy/ against the real API server: every
// object passes a server-side apply with dryRun=All; the kube-proxy
// ConfigMap's config.conf and the DaemonSet's command load with kproxy's own
// loader; and the ClusterRole grants kproxy's ServiceAccount what it needs
// and nothing it does not (SubjectAccessReviews after the RBAC objects are
// created for real, then deleted).
func TestDeployManifests(t *testing.T) {
	cp := sharedControlPlane(t)
	ctx := context.Background()
	objs := readManifests(t)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetObjectKind().GroupVersionKind().Kind]++
		if err := dryRunApply(ctx, cp.Client, o); err != nil {
			t.Errorf("server-side dry-run apply of %s: %v", describe(o), err)
		}
	}
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "ConfigMap"} {
		if kinds[k] != 1 {
			t.Errorf("deploy/ has %d %s objects, want 1", kinds[k], k)
		}
	}
	cm, ds := only[*v1.ConfigMap](t, objs), only[*appsv1.DaemonSet](t, objs)
	if cm == nil || ds == nil {
		return
	}
	t.Run("ConfigLoads", func(t *testing.T) { testDeployConfig(t, cm, ds) })
	t.Run("LeastPrivilege", func(t *testing.T) { testDeployRBAC(t, cp.Client, objs) })
}

// readManifests decodes every document of deploy/*.yaml.
func readManifests(t *testing.T) []runtime.Object {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s (%v)", deployDir, err)
	}
	var out []runtime.Object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufioReader(data))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(bytes.TrimSpace(stripComments(doc))) == 0 {
				continue
			}
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s: decoding a document: %v", f, err)
			}
			out = append(out, obj)
		}
	}
	return out
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, l := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.Bytes()
}

// dryRunApply is `kubectl apply --server-side --dry-run=server` for one
// object.
func dryRunApply(ctx context.Context, c kubernetes.Interface, o runtime.Object) error {
	data, err := json.Marshal(o)
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: "kproxy-e2e", Force: ptr.To(true)}
	switch x := o.(type) {
	case *v1.ServiceAccount:
		_, err = c.CoreV1().ServiceAccounts(x.Namespace).Patch(ctx, x.Name, types.ApplyPatchType, data, opts)
	case *v1.ConfigMap:
		_, err = c.CoreV1().ConfigMaps(x.Namespace).Patch(ctx, x.Name, types.ApplyPatchType, data, opts)
	case *rbacv1.ClusterRole:
		_, err = c.RbacV1().ClusterRoles().Patch(ctx, x.Name, types.ApplyPatchType, data, opts)
	case *rbacv1.ClusterRoleBinding:
		_, err = c.RbacV1().ClusterRoleBindings().Patch(ctx, x.Name, types.ApplyPatchType, data, opts)
	case *appsv1.DaemonSet:
		_, err = c.AppsV1().DaemonSets(x.Namespace).Patch(ctx, x.Name, types.ApplyPatchType, data, opts)
	default:
		return errors.New("kind not expected in deploy/")
	}
	return err
}

func describe(o runtime.Object) string {
	m := o.(metav1.Object) // every kind the scheme decodes has object metadata
	return o.GetObjectKind().GroupVersionKind().Kind + " " + m.GetNamespace() + "/" + m.GetName()
}

func only[T runtime.Object](t *testing.T, objs []runtime.Object) T {
	t.Helper()
	var zero T
	for _, o := range objs {
		if x, ok := o.(T); ok {
			return x
		}
	}
	t.Errorf("deploy/ has no %T", zero)
	return zero
}

// testDeployConfig writes the ConfigMap's files where the DaemonSet mounts
// them (a temporary directory standing in for /var/lib/kube-proxy) and runs
// kproxy's loader on the container's arguments.
func testDeployConfig(t *testing.T, cm *v1.ConfigMap, ds *appsv1.DaemonSet) {
	dir := t.TempDir()
	for name, content := range cm.Data {
		content = strings.ReplaceAll(content, "/var/lib/kube-proxy", dir)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var mount string
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
			for _, m := range ds.Spec.Template.Spec.Containers[0].VolumeMounts {
				if m.Name == v.Name {
					mount = m.MountPath
				}
			}
		}
	}
	if mount == "" {
		t.Fatalf("the DaemonSet does not mount ConfigMap %s", cm.Name)
	}
	c := ds.Spec.Template.Spec.Containers[0]
	var args []string
	for _, a := range append(c.Command[1:], c.Args...) {
		a = strings.ReplaceAll(a, mount, dir)
		args = append(args, strings.ReplaceAll(a, "$(NODE_NAME)", "node1"))
	}
	opts, err := config.Load(args)
	if err != nil {
		t.Fatalf("kproxy %s: %v", strings.Join(args, " "), err)
	}
	if opts.Config.Mode != "nftables" || opts.Config.ClientConnection.Kubeconfig != filepath.Join(dir, "kubeconfig.conf") {
		t.Errorf("loaded mode %q kubeconfig %q, want nftables and the ConfigMap's kubeconfig.conf",
			opts.Config.Mode, opts.Config.ClientConnection.Kubeconfig)
	}
	if !strings.HasSuffix(c.Command[0], "/kproxy") {
		t.Errorf("container command %q, want the kproxy binary", c.Command[0])
	}
	t.Logf("kproxy %s: mode %s, hostname %s, %d warnings", strings.Join(args, " "), opts.Config.Mode, opts.Config.HostnameOverride, len(opts.Warnings))
}

// testDeployRBAC creates the ServiceAccount, ClusterRole and binding for
// real and asks the API server what the ServiceAccount may do.
func testDeployRBAC(t *testing.T, c kubernetes.Interface, objs []runtime.Object) {
	ctx := context.Background()
	var user string
	for _, o := range objs {
		var err error
		switch x := o.(type) {
		case *v1.ServiceAccount:
			user = "system:serviceaccount:" + x.Namespace + ":" + x.Name
			_, err = c.CoreV1().ServiceAccounts(x.Namespace).Create(ctx, x, metav1.CreateOptions{})
			t.Cleanup(func() { _ = c.CoreV1().ServiceAccounts(x.Namespace).Delete(ctx, x.Name, metav1.DeleteOptions{}) })
		case *rbacv1.ClusterRole:
			_, err = c.RbacV1().ClusterRoles().Create(ctx, x, metav1.CreateOptions{})
			t.Cleanup(func() { _ = c.RbacV1().ClusterRoles().Delete(ctx, x.Name, metav1.DeleteOptions{}) })
		case *rbacv1.ClusterRoleBinding:
			_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, x, metav1.CreateOptions{})
			t.Cleanup(func() { _ = c.RbacV1().ClusterRoleBindings().Delete(ctx, x.Name, metav1.DeleteOptions{}) })
		}
		if err != nil {
			t.Fatalf("creating %s: %v", describe(o), err)
		}
	}
	type access struct {
		verb, group, resource string
		allowed               bool
	}
	for _, a := range []access{
		{"list", "", "services", true}, {"watch", "", "services", true},
		{"list", "discovery.k8s.io", "endpointslices", true}, {"watch", "discovery.k8s.io", "endpointslices", true},
		{"get", "", "nodes", true}, {"list", "", "nodes", true}, {"watch", "", "nodes", true},
		{"list", "networking.k8s.io", "servicecidrs", true}, {"watch", "networking.k8s.io", "servicecidrs", true},
		{"create", "", "events", true}, {"create", "events.k8s.io", "events", true},
		// Nothing more: no writes to what it watches, no secrets, no pods.
		{"update", "", "services", false}, {"delete", "discovery.k8s.io", "endpointslices", false},
		{"patch", "", "nodes", false}, {"list", "", "secrets", false}, {"get", "", "secrets", false},
		{"list", "", "pods", false}, {"create", "", "pods", false},
	} {
		sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"},
			ResourceAttributes: &authzv1.ResourceAttributes{
				Verb: a.verb, Group: a.group, Resource: a.resource, Namespace: "",
			},
		}}
		got, err := c.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != a.allowed {
			t.Errorf("%s may %s %s.%s: %v, want %v (%s)", user, a.verb, a.resource, a.group, got.Status.Allowed, a.allowed, got.Status.Reason)
		}
	}
}

func bufioReader(data []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(data)) }
