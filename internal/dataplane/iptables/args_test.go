package iptables

import (
	"slices"
	"strings"
	"testing"
)

// splitArgsSlow is the plain definition of splitArgs: quotes toggle, a
// backslash inside quotes takes the next byte, blanks outside split.
func splitArgsSlow(s string) []string {
	var out []string
	var cur strings.Builder
	inQ, has := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			inQ, has = !inQ, true
		case c == '\\' && inQ && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			has = true
		case (c == ' ' || c == '\t') && !inQ:
			if has {
				out = append(out, cur.String())
				cur.Reset()
				has = false
			}
		default:
			cur.WriteByte(c)
			has = true
		}
	}
	if has {
		out = append(out, cur.String())
	}
	return out
}

// FuzzSplitArgs: the substring-sharing splitter agrees with the plain one.
func FuzzSplitArgs(f *testing.F) {
	for _, s := range []string{
		`-m comment --comment "ns/svc:p cluster IP" -m tcp -p tcp -d 198.18.0.1/32 --dport 80 -j KUBE-SVC-X`,
		`--comment ""`, `"a\"b" c`, `"unterminated x`, `a"b c"d`, "\t a \t", `"x\`, `"\\"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, want := splitArgs(s), splitArgsSlow(s)
		if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("splitArgs(%q) = %q, want %q", s, got, want)
		}
	})
}
