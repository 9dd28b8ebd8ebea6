package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"time"
)

// The serving certificate and key, in Dir.
const (
	servingCertFile = "apiserver.crt"
	servingKeyFile  = "apiserver.key"
)

// StopAPIServer ends kube-apiserver (by PID: SIGTERM, SIGKILL after 5 s)
// and leaves etcd running: to clients it is an API server outage, their
// connections reset and new ones refused. Stopping it twice is not an
// error.
func (cp *ControlPlane) StopAPIServer() error {
	if err := cp.apiserver.stop(5 * time.Second); err != nil {
		return err
	}
	cp.logf("controlplane: kube-apiserver stopped")
	return nil
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, with the
// same flags and port (so kubeconfigs and clients stay valid), and waits
// for /readyz. It is an error while kube-apiserver runs.
func (cp *ControlPlane) StartAPIServer(ctx context.Context) error {
	if done, _ := cp.apiserver.exited(); !done {
		return errors.New("controlplane: kube-apiserver is running")
	}
	began := time.Now()
	if err := cp.startAPIServer(cp.etcdURL); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cp.opts.Timeout)
	defer cancel()
	if err := cp.waitReady(ctx); err != nil {
		return err
	}
	cp.logf("controlplane: kube-apiserver ready again after %v", time.Since(began).Round(time.Millisecond))
	return nil
}

// RenewServingCert writes a new serving key and certificate, signed by the
// testbed CA (CAFile), for kube-apiserver's next start; clients that trust
// the CA accept it unchanged.
func (cp *ControlPlane) RenewServingCert() error {
	serial, err := cp.ca.issueServing(cp.path(servingCertFile), cp.path(servingKeyFile))
	if err != nil {
		return err
	}
	cp.logf("controlplane: serving certificate serial %x", serial)
	return nil
}

// ServingCertSerial connects to the API server, verifies its certificate
// against CAFile as TLSServerName, and returns the certificate's serial
// number.
func (cp *ControlPlane) ServingCertSerial(ctx context.Context) (*big.Int, error) {
	pemCA, err := os.ReadFile(cp.CAFile)
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pemCA) {
		return nil, fmt.Errorf("controlplane: no certificate in %s", cp.CAFile)
	}
	d := tls.Dialer{Config: &tls.Config{RootCAs: roots, ServerName: TLSServerName}}
	addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(cp.Port)).String()
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("controlplane: TLS to %s: %w", addr, err)
	}
	defer conn.Close()
	certs := conn.(*tls.Conn).ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return nil, fmt.Errorf("controlplane: %s sent no certificate", addr)
	}
	return certs[0].SerialNumber, nil
}
