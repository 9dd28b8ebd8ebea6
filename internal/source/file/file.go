// Package file is kproxy's file source (--source-file, a kproxy extension): a
// multi-document YAML file of Services, EndpointSlices, Nodes and
// ServiceCIDRs, polled for
// changes, whose differences from the previous read are reported to a
// source.Handler. It lets kproxy run with no cluster at all.
package file

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"reflect"
	"time"

	"k8s.io/klog/v2"

	"github.com/kproxy/kproxy/internal/objects"
	"github.com/kproxy/kproxy/internal/source"
)

// DefaultInterval is how often Run checks the file for changes.
const DefaultInterval = time.Second

// Source watches one file. Create it with New; Run starts it.
type Source struct {
	path     string
	nodeName string
	h        source.Handler
	logger   klog.Logger
	interval time.Duration

	// What the Handler was last told.
	stamp    stamp
	sum      [sha256.Size]byte
	services map[objects.Key]*objects.Service
	slices   map[objects.Key]*objects.EndpointSlice
	node     *objects.Node
	cidrs    map[objects.Key]*objects.ServiceCIDR
}

// stamp is what a stat tells about the file; a change means "read it again".
type stamp struct {
	modTime time.Time
	size    int64
	ino     uint64
}

// New returns a Source for the file at path; of the Nodes in it, only the
// one called nodeName is reported. New reads nothing.
func New(path, nodeName string, h source.Handler, logger klog.Logger) *Source {
	return &Source{
		path: path, nodeName: nodeName, h: h, logger: logger, interval: DefaultInterval,
		services: map[objects.Key]*objects.Service{},
		slices:   map[objects.Key]*objects.EndpointSlice{},
		cidrs:    map[objects.Key]*objects.ServiceCIDR{},
	}
}

// Run reads the file, reports its objects and OnSynced for every kind, then
// checks the file every second and reports what changed, until ctx is done.
// Malformed documents are logged and skipped. It returns an error only when
// the first read fails; later read errors (a file briefly missing while an
// editor replaces it) are logged and the last good state is kept.
func (s *Source) Run(ctx context.Context) error {
	if err := s.check(true); err != nil {
		return err
	}
	for _, k := range []source.Kind{source.Services, source.EndpointSlices, source.Nodes, source.ServiceCIDRs} {
		s.h.OnSynced(k)
	}
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := s.check(false); err != nil {
				s.logger.Error(err, "Keeping the previous state of the source file", "path", s.path)
			}
		}
	}
}

// check re-reads the file when its stamp changed (always when force) and
// reports the differences when its content changed.
func (s *Source) check(force bool) error {
	fi, err := os.Stat(s.path)
	if err != nil {
		return fmt.Errorf("source file: %w", err)
	}
	st := stampOf(fi)
	if !force && st == s.stamp {
		return nil
	}
	data, err := os.ReadFile(s.path)
	if err != nil {
		return fmt.Errorf("source file: %w", err)
	}
	s.stamp = st
	sum := sha256.Sum256(data)
	if !force && bytes.Equal(sum[:], s.sum[:]) {
		return nil
	}
	s.sum = sum
	objs, problems := Parse(data)
	for _, p := range problems {
		s.logger.Error(p, "Skipping malformed document in the source file", "path", s.path)
	}
	s.apply(objs)
	s.logger.V(2).Info("Read the source file", "path", s.path, "services", len(s.services), "endpointSlices", len(s.slices), "node", s.node != nil, "serviceCIDRs", len(s.cidrs), "problems", len(problems))
	return nil
}

// apply reports what differs between objs and the previous read.
func (s *Source) apply(objs Objects) {
	services := make(map[objects.Key]*objects.Service, len(objs.Services))
	for _, svc := range objs.Services {
		services[svc.Key()] = svc
	}
	slices := make(map[objects.Key]*objects.EndpointSlice, len(objs.Slices))
	for _, es := range objs.Slices {
		slices[es.Key()] = es
	}
	cidrs := make(map[objects.Key]*objects.ServiceCIDR, len(objs.ServiceCIDRs))
	for _, c := range objs.ServiceCIDRs {
		cidrs[c.Key()] = c
	}
	diff(s.services, services, s.h.OnService, s.h.OnServiceDeleted)
	diff(s.slices, slices, s.h.OnSlice, s.h.OnSliceDeleted)
	diff(s.cidrs, cidrs, s.h.OnServiceCIDR, func(k objects.Key) { s.h.OnServiceCIDRDeleted(k.Name) })
	s.services, s.slices, s.cidrs = services, slices, cidrs
	s.applyNode(objs.Nodes)
}

func (s *Source) applyNode(nodes []*objects.Node) {
	var node *objects.Node
	for _, n := range nodes {
		if n.Name == s.nodeName {
			node = n
		}
	}
	switch {
	case node == nil && s.node != nil:
		s.h.OnNodeDeleted()
	case node != nil && !reflect.DeepEqual(node, s.node):
		s.h.OnNode(node)
	}
	s.node = node
}

// diff calls put for objects added or changed from old to cur and del for
// those gone.
func diff[T any](old, cur map[objects.Key]*T, put func(*T), del func(objects.Key)) {
	for k, o := range cur {
		if prev, ok := old[k]; !ok || !reflect.DeepEqual(prev, o) {
			put(o)
		}
	}
	for k := range old {
		if _, ok := cur[k]; !ok {
			del(k)
		}
	}
}
