// Package dptest holds the test scaffolding the dataplane packages share:
// a privileged network-namespace lab (node, pod and client namespaces
// joined by veths), builders of model snapshots, the packet and result
// types of the rule tracers with their branch explorer, and the table of
// cases of the source × frontend × policy × endpoints matrix.
//
// It is imported by _test.go files only. Each dataplane keeps its own
// tracer, since the rules it reads differ; what is here is the same for
// both.
package dptest
