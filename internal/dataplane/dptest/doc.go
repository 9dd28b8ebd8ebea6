// Package dptest holds the test scaffolding the dataplane packages share:
// a privileged network-namespace lab (node, pod and client namespaces
// joined by veths), builders of model snapshots, the rule tracers' types
// from package trace with an explorer that fails the test, and the table
// of cases of the source × frontend × policy × endpoints matrix.
//
// It is imported by _test.go files only. The tracers themselves are
// production code (package trace and each dataplane's trace.go), as
// `kproxy explain --verify` runs them over the kernel's rules.
package dptest
