package conntrack

import (
	"context"
	"errors"
	"maps"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"
)

// fakeFiles is an IntFiles over a map; paths missing from it fail to read.
type fakeFiles struct {
	values   map[string]int
	writes   []string
	failPath string
}

func (f *fakeFiles) ReadInt(path string) (int, error) {
	v, ok := f.values[path]
	if !ok {
		return 0, errors.New("no such file")
	}
	return v, nil
}

func (f *fakeFiles) WriteInt(path string, value int) error {
	if path == f.failPath {
		return errors.New("read-only file system")
	}
	f.writes = append(f.writes, path)
	f.values[path] = value
	return nil
}

const (
	pMax         = sysctlDir + "nf_conntrack_max"
	pEstablished = sysctlDir + "nf_conntrack_tcp_timeout_established"
	pCloseWait   = sysctlDir + "nf_conntrack_tcp_timeout_close_wait"
	pLiberal     = sysctlDir + "nf_conntrack_tcp_be_liberal"
	pUDP         = sysctlDir + "nf_conntrack_udp_timeout"
	pUDPStream   = sysctlDir + "nf_conntrack_udp_timeout_stream"
)

func dur(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

// upstreamDefaults is the conntrack block as upstream defaults it.
func upstreamDefaults() kpv1alpha1.KubeProxyConntrackConfiguration {
	return kpv1alpha1.KubeProxyConntrackConfiguration{
		MaxPerCore:            ptr.To[int32](32768),
		Min:                   ptr.To[int32](131072),
		TCPEstablishedTimeout: dur(24 * time.Hour),
		TCPCloseWaitTimeout:   dur(time.Hour),
	}
}

func TestApplySysctls(t *testing.T) {
	tests := []struct {
		name    string
		cfg     func(*kpv1alpha1.KubeProxyConntrackConfiguration)
		cpus    int
		initial map[string]int
		fail    string
		want    map[string]int
		writes  int
		wantErr bool
	}{{
		name:    "defaults on 2 cores: min wins, hashsize raised",
		cpus:    2,
		initial: map[string]int{hashsizePath: 1024},
		want:    map[string]int{pMax: 131072, hashsizePath: 32768, pEstablished: 86400, pCloseWait: 3600},
		writes:  4,
	}, {
		name:    "defaults on 8 cores: scaled",
		cpus:    8,
		initial: map[string]int{hashsizePath: 1 << 20},
		want:    map[string]int{pMax: 262144, hashsizePath: 1 << 20, pEstablished: 86400, pCloseWait: 3600},
		writes:  3,
	}, {
		name:    "capped at 2^20",
		cpus:    64,
		initial: map[string]int{hashsizePath: 1 << 20},
		want:    map[string]int{pMax: 1 << 20, hashsizePath: 1 << 20, pEstablished: 86400, pCloseWait: 3600},
		writes:  3,
	}, {
		name:    "values already in place are not written",
		cpus:    2,
		initial: map[string]int{pMax: 131072, hashsizePath: 32768, pEstablished: 86400, pCloseWait: 3600},
		want:    map[string]int{pMax: 131072, hashsizePath: 32768, pEstablished: 86400, pCloseWait: 3600},
		writes:  0,
	}, {
		name: "maxPerCore 0 leaves nf_conntrack_max and hashsize alone",
		cfg: func(c *kpv1alpha1.KubeProxyConntrackConfiguration) {
			c.MaxPerCore = ptr.To[int32](0)
		},
		cpus:   2,
		want:   map[string]int{pEstablished: 86400, pCloseWait: 3600},
		writes: 2,
	}, {
		name: "every timeout and be-liberal",
		cfg: func(c *kpv1alpha1.KubeProxyConntrackConfiguration) {
			c.MaxPerCore = nil
			c.TCPBeLiberal = true
			c.UDPTimeout = metav1.Duration{Duration: 30 * time.Second}
			c.UDPStreamTimeout = metav1.Duration{Duration: 2 * time.Minute}
		},
		cpus:   2,
		want:   map[string]int{pEstablished: 86400, pCloseWait: 3600, pLiberal: 1, pUDP: 30, pUDPStream: 120},
		writes: 5,
	}, {
		name: "zero timeouts are not set",
		cfg: func(c *kpv1alpha1.KubeProxyConntrackConfiguration) {
			c.MaxPerCore = nil
			c.TCPEstablishedTimeout = dur(0)
			c.TCPCloseWaitTimeout = nil
		},
		cpus:   2,
		want:   map[string]int{},
		writes: 0,
	}, {
		name:    "read-only nf_conntrack_max (a network namespace) fails",
		cpus:    2,
		initial: map[string]int{hashsizePath: 1024},
		fail:    pMax,
		want:    map[string]int{hashsizePath: 1024},
		wantErr: true,
	}, {
		name:    "unreadable hashsize fails",
		cpus:    2,
		want:    map[string]int{pMax: 131072},
		writes:  1,
		wantErr: true,
	}, {
		name:    "read-only /sys hashsize fails",
		cpus:    2,
		initial: map[string]int{hashsizePath: 1024},
		fail:    hashsizePath,
		want:    map[string]int{pMax: 131072, hashsizePath: 1024},
		writes:  1,
		wantErr: true,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := upstreamDefaults()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			files := &fakeFiles{values: maps.Clone(tc.initial), failPath: tc.fail}
			if files.values == nil {
				files.values = map[string]int{}
			}
			err := ApplySysctls(context.Background(), &cfg, tc.cpus, files)
			if (err != nil) != tc.wantErr {
				t.Fatalf("ApplySysctls() error = %v, wantErr %v", err, tc.wantErr)
			}
			if !maps.Equal(files.values, tc.want) {
				t.Errorf("values = %v, want %v", files.values, tc.want)
			}
			if len(files.writes) != tc.writes {
				t.Errorf("wrote %v, want %d writes", files.writes, tc.writes)
			}
		})
	}
}
