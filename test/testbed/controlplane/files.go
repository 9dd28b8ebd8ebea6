package controlplane

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"strings"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The users of the token file.
const (
	// AdminUser is in group system:masters: it may do anything.
	AdminUser = "admin"
	// KproxyUser is bound to the bootstrap ClusterRole system:node-proxier,
	// the permissions upstream kube-proxy runs with (watch Services,
	// EndpointSlices, Nodes and, since MultiCIDRServiceAllocator is GA,
	// networking.k8s.io ServiceCIDRs; create Events).
	KproxyUser = "kproxy"
	// NodeProxierRole is the ClusterRole KproxyUser is bound to.
	NodeProxierRole = "system:node-proxier"
)

// newToken returns a random bearer token.
func newToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("controlplane: token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// writeTokenFile writes the API server's --token-auth-file: one line per
// user, "token,user,uid,groups".
func writeTokenFile(path, adminToken, kproxyToken string) error {
	lines := []string{
		fmt.Sprintf("%s,%s,%s,\"system:masters\"", adminToken, AdminUser, AdminUser),
		fmt.Sprintf("%s,%s,%s", kproxyToken, KproxyUser, KproxyUser),
	}
	return writeFile(path, strings.Join(lines, "\n")+"\n")
}

// writeServiceAccountKey writes a new RSA private key (PKCS#1 PEM). The API
// server takes it both as signing key and as verification key.
func writeServiceAccountKey(path string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("controlplane: service account key: %w", err)
	}
	block := &pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}
	return writeFile(path, string(pem.EncodeToMemory(block)))
}

// writeKubeconfig writes a self-contained kubeconfig for server with a
// bearer token. It embeds the CA in caFile and verifies the server as
// TLSServerName, so it works whatever address server names.
func writeKubeconfig(path, server, caFile, user, token string) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("controlplane: kubeconfig CA: %w", err)
	}
	cfg := clientcmdapi.NewConfig()
	cluster := clientcmdapi.NewCluster()
	cluster.Server = server
	cluster.CertificateAuthorityData = ca
	cluster.TLSServerName = TLSServerName
	cfg.Clusters["testbed"] = cluster
	auth := clientcmdapi.NewAuthInfo()
	auth.Token = token
	cfg.AuthInfos[user] = auth
	ctx := clientcmdapi.NewContext()
	ctx.Cluster, ctx.AuthInfo = "testbed", user
	cfg.Contexts[user] = ctx
	cfg.CurrentContext = user
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("controlplane: write kubeconfig %s: %w", path, err)
	}
	return nil
}

func writeFile(path, content string) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return fmt.Errorf("controlplane: %w", err)
	}
	return nil
}
