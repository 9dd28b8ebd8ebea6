package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// mdLink matches an inline Markdown link or image: [text](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// repoRoot is the directory of go.mod above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// docFiles returns every README.md of the repository, the Markdown files
// at its root and those in docs/, relative to root.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if name := d.Name(); rel != "." && (strings.HasPrefix(name, ".") || name == "bin" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		dir := filepath.Dir(rel)
		if d.Name() == "README.md" || (strings.HasSuffix(rel, ".md") && (dir == "." || dir == "docs")) {
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// linkTargets returns the relative link targets of a Markdown text, outside
// fenced code blocks, without their #anchor.
func linkTargets(text string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			if target != "" {
				out = append(out, target)
			}
		}
	}
	return out
}

// TestDocLinks: every relative link in the repository's READMEs and docs
// points at a file or directory that exists.
func TestDocLinks(t *testing.T) {
	root := repoRoot(t)
	for _, doc := range docFiles(t, root) {
		text, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, target := range linkTargets(string(text)) {
			path := filepath.Join(root, filepath.Dir(doc), filepath.FromSlash(target))
			if strings.HasPrefix(target, "/") {
				path = filepath.Join(root, filepath.FromSlash(target))
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s, which does not exist", doc, target)
			}
		}
	}
}

// TestFoldersHaveREADME: every folder under internal/ and cmd/ (testdata
// excepted) has a README.md.
func TestFoldersHaveREADME(t *testing.T) {
	root := repoRoot(t)
	for _, top := range []string{"internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			if path == filepath.Join(root, top) {
				return nil // the root README's Layout describes it
			}
			if _, err := os.Stat(filepath.Join(path, "README.md")); err != nil {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s has no README.md", rel)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestLinkTargets(t *testing.T) {
	text := "see [a](../a.md#x), [b](http://x/y), [c](#top), ![d](img.png)\n```\n[e](gone)\n```\n[f](dir/)"
	got := strings.Join(linkTargets(text), " ")
	if want := "../a.md img.png dir/"; got != want {
		t.Errorf("linkTargets = %q, want %q", got, want)
	}
}
