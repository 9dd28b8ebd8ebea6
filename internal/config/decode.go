package config

import (
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
)

// decoders holds a strict and a lenient deserializer for the one API
// version kube-proxy reads, kubeproxy.config.k8s.io/v1alpha1. Both accept
// YAML and JSON.
type decoders struct {
	strict, lenient runtime.Decoder
}

func newDecoders() decoders {
	scheme := runtime.NewScheme()
	if err := kpv1alpha1.AddToScheme(scheme); err != nil {
		panic(fmt.Sprintf("registering kube-proxy config types: %v", err)) // programming error
	}
	return decoders{
		strict:  serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer(),
		lenient: serializer.NewCodecFactory(scheme, serializer.DisableStrict).UniversalDeserializer(),
	}
}

var configDecoders = newDecoders()

// Decode decodes a KubeProxyConfiguration from YAML or JSON without
// defaulting it. As upstream, it decodes strictly first; when that fails
// only because of unknown or duplicate fields, it decodes leniently and
// returns one warning per offending field (for example
// `unknown field "iptables.masqueradeBitt"`), so that every file upstream
// accepts is accepted. A wrong apiVersion or kind, or malformed YAML/JSON,
// is an error.
func Decode(data []byte) (*kpv1alpha1.KubeProxyConfiguration, []string, error) {
	obj, gvk, err := configDecoders.strict.Decode(data, nil, nil)
	var warnings []string
	if err != nil {
		if !runtime.IsStrictDecodingError(err) {
			return nil, nil, fmt.Errorf("failed to decode: %w", err)
		}
		var lenientErr error
		obj, gvk, lenientErr = configDecoders.lenient.Decode(data, nil, nil)
		if lenientErr != nil {
			return nil, nil, fmt.Errorf("failed lenient decoding: %w", err)
		}
		warnings = strictWarnings(err)
	}
	cfg, ok := obj.(*kpv1alpha1.KubeProxyConfiguration)
	if !ok {
		return nil, nil, fmt.Errorf("got unexpected config type: %v", gvk)
	}
	return cfg, warnings, nil
}

// strictWarnings turns a strict decoding error into one message per problem.
func strictWarnings(err error) []string {
	strictErr, ok := runtime.AsStrictDecodingError(err)
	if !ok {
		return []string{err.Error()}
	}
	var out []string
	for _, e := range strictErr.Errors() {
		out = append(out, e.Error())
	}
	return out
}

// LoadFile reads, decodes and defaults the KubeProxyConfiguration in path.
// Warnings name each unknown or duplicate field, prefixed by the path.
func LoadFile(path string) (*kpv1alpha1.KubeProxyConfiguration, []string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	cfg, warnings, err := Decode(data)
	if err != nil {
		return nil, nil, fmt.Errorf("config file %q: %w", path, err)
	}
	for i, w := range warnings {
		warnings[i] = fmt.Sprintf("config file %q: %s (ignored; strict decoding failed, decoded leniently as upstream kube-proxy does)", path, w)
	}
	setAPIDefaults(cfg)
	return cfg, warnings, nil
}
