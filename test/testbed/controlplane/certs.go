package controlplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"
)

// The testbed's PKI: a CA made by Start, and the API server's serving
// certificate signed by it. Clients trust the CA (CAFile, embedded in the
// kubeconfigs), so the serving certificate can be renewed, as a cluster's
// certificate rotation does, without touching any client.

// ca is the testbed's certificate authority; its key stays in memory.
type ca struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// newCA makes a CA and writes its certificate to certFile.
func newCA(certFile string) (*ca, error) {
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "kproxy-testbed-ca"},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	key, der, err := issue(tmpl, nil)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("controlplane: CA certificate: %w", err)
	}
	if err := writeFile(certFile, pemText("CERTIFICATE", der)); err != nil {
		return nil, err
	}
	return &ca{cert: cert, key: key}, nil
}

// servingNames are the DNS names the serving certificate holds:
// TLSServerName and the other names of the kubernetes Service.
var servingNames = []string{"kubernetes", "kubernetes.default", TLSServerName, "kubernetes.default.svc.cluster.local", "localhost"}

// issueServing writes a new key and serving certificate, signed by c, for
// servingNames and the API server's addresses. It returns the certificate's
// serial number.
func (c *ca) issueServing(certFile, keyFile string) (*big.Int, error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    servingNames,
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback,
			AdvertiseAddress4.AsSlice(), KubernetesServiceIP4.AsSlice()},
	}
	key, der, err := issue(tmpl, c)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("controlplane: serving key: %w", err)
	}
	if err := writeFile(keyFile, pemText("EC PRIVATE KEY", keyDER)); err != nil {
		return nil, err
	}
	if err := writeFile(certFile, pemText("CERTIFICATE", der)); err != nil {
		return nil, err
	}
	return tmpl.SerialNumber, nil
}

// issue makes a new P-256 key and a certificate for it from tmpl, valid for
// a week from an hour ago with a random serial number (set in tmpl), signed
// by parent, or by itself when parent is nil.
func issue(tmpl *x509.Certificate, parent *ca) (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("controlplane: key for %s: %w", tmpl.Subject.CommonName, err)
	}
	if tmpl.SerialNumber, err = newSerial(); err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(7*24*time.Hour)
	signer, signerKey := tmpl, crypto.Signer(key)
	if parent != nil {
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, key.Public(), signerKey)
	if err != nil {
		return nil, nil, fmt.Errorf("controlplane: certificate for %s: %w", tmpl.Subject.CommonName, err)
	}
	return key, der, nil
}

func pemText(typ string, der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

// newSerial is a random 128-bit certificate serial number.
func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("controlplane: serial number: %w", err)
	}
	return n, nil
}
