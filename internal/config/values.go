package config

import (
	"fmt"
	"net"

	"github.com/spf13/pflag"
	netutils "k8s.io/utils/net"
)

// The flag values below mirror upstream's flag types, quirks included: an
// empty value leaves the target unchanged (so `--metrics-bind-address=`
// keeps the default, as in upstream; --metrics-port=0 disables the server).

var (
	_ pflag.Value = (*ipValue)(nil)
	_ pflag.Value = (*ipPortValue)(nil)
	_ pflag.Value = (*stringValue)(nil)
)

// ipValue is an "ip" flag: an IP address.
type ipValue struct{ val *string }

func (v *ipValue) Set(s string) error {
	if s == "" {
		return nil
	}
	if netutils.ParseIPSloppy(s) == nil {
		return fmt.Errorf("%q is not a valid IP address", s)
	}
	*v.val = s
	return nil
}

func (v *ipValue) String() string { return *v.val }
func (v *ipValue) Type() string   { return "ip" }

// ipPortValue is an "ipport" flag: an IP or IP:port.
type ipPortValue struct{ val *string }

func (v *ipPortValue) Set(s string) error {
	if s == "" {
		return nil
	}
	if netutils.ParseIPSloppy(s) != nil {
		*v.val = s
		return nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not in a valid format (ip or ip:port): %w", s, err)
	}
	if netutils.ParseIPSloppy(host) == nil {
		return fmt.Errorf("%q is not a valid IP address", host)
	}
	if _, err := netutils.ParsePort(port, true); err != nil {
		return fmt.Errorf("%q is not a valid number", port)
	}
	*v.val = s
	return nil
}

func (v *ipPortValue) String() string { return *v.val }
func (v *ipPortValue) Type() string   { return "ipport" }

// stringValue is a string-typed flag with a custom type name, for the
// ProxyMode and LocalMode named string types (upstream: "ProxyMode",
// "LocalMode").
type stringValue struct {
	get      func() string
	set      func(string)
	typeName string
}

func (v *stringValue) Set(s string) error { v.set(s); return nil }
func (v *stringValue) String() string     { return v.get() }
func (v *stringValue) Type() string       { return v.typeName }
