package config

import (
	"bytes"
	"errors"
	"fmt"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
)

// Encode renders cfg as a kubeproxy.config.k8s.io/v1alpha1
// KubeProxyConfiguration YAML document (apiVersion and kind set, keys
// sorted) byte for byte as upstream's --write-config-to does: upstream keeps
// one sync period pair and one masqueradeAll, so only the selected mode's
// section carries them and the other sections hold zero values (which
// decode and default back to the same effective configuration). cfg is not
// modified.
func Encode(cfg *kpv1alpha1.KubeProxyConfiguration) ([]byte, error) {
	scheme := runtime.NewScheme()
	if err := kpv1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("registering kube-proxy config types: %w", err)
	}
	codecs := serializer.NewCodecFactory(scheme)
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeYAML)
	if !ok {
		return nil, errors.New("no YAML serializer")
	}
	enc := codecs.EncoderForVersion(info.Serializer, kpv1alpha1.SchemeGroupVersion)
	var buf bytes.Buffer
	if err := enc.Encode(Canonical(cfg), &buf); err != nil {
		return nil, fmt.Errorf("encoding KubeProxyConfiguration: %w", err)
	}
	return buf.Bytes(), nil
}

// WriteConfig writes cfg to path as Encode renders it.
func WriteConfig(path string, cfg *kpv1alpha1.KubeProxyConfiguration) error {
	data, err := Encode(cfg)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("writing config: %w", err)
	}
	return nil
}

// Canonical returns a copy of cfg as upstream presents its effective
// configuration (--write-config-to, /configz): apiVersion and kind set, and
// the sections of the modes not selected without sync periods or
// masqueradeAll, as upstream's internal-to-v1alpha1 conversion leaves them
// (upstream keeps one sync period pair and one masqueradeAll internally),
// and no portRange (upstream's internal configuration has none: it is
// ignored, and load warns about it).
func Canonical(cfg *kpv1alpha1.KubeProxyConfiguration) *kpv1alpha1.KubeProxyConfiguration {
	c := cfg.DeepCopy()
	c.APIVersion = kpv1alpha1.SchemeGroupVersion.String()
	c.Kind = ConfigKind
	c.PortRange = ""
	active := modePeriods(c)
	masqueradeAll := *active.masqueradeAll
	sync, minSync := *active.sync, *active.minSync
	c.IPTables.SyncPeriod, c.IPTables.MinSyncPeriod, c.IPTables.MasqueradeAll = metav1.Duration{}, metav1.Duration{}, false
	c.IPVS.SyncPeriod, c.IPVS.MinSyncPeriod = metav1.Duration{}, metav1.Duration{}
	c.NFTables.SyncPeriod, c.NFTables.MinSyncPeriod, c.NFTables.MasqueradeAll = metav1.Duration{}, metav1.Duration{}, false
	active = modePeriods(c)
	*active.sync, *active.minSync, *active.masqueradeAll = sync, minSync, masqueradeAll
	return c
}
