package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // umask
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestCopyTreeKeepsContentModesLinksAndTimes(t *testing.T) {
	src, dst := filepath.Join(t.TempDir(), "src"), filepath.Join(t.TempDir(), "dst")
	writeFile(t, filepath.Join(src, "a.txt"), "alpha", 0o644)
	writeFile(t, filepath.Join(src, "bin", "run.sh"), "#!/bin/sh\n", 0o755)
	writeFile(t, filepath.Join(src, "deep", "er", "c"), "", 0o600)
	if err := os.Symlink("../a.txt", filepath.Join(src, "bin", "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(src, "a.txt"), filepath.Join(src, "hard")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(src, "fifo"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "empty"), 0o700); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, p := range []string{"a.txt", "bin"} {
		if err := os.Chtimes(filepath.Join(src, p), old, old); err != nil {
			t.Fatal(err)
		}
	}

	stats, err := copyTree(src, dst)
	if err != nil {
		t.Fatal(err)
	}
	// a.txt and hard are one inode: counted and copied once.
	if stats.Files != 3 || stats.Bytes != int64(len("alpha")+len("#!/bin/sh\n")) {
		t.Errorf("stats = %+v", stats)
	}
	if got := readFile(t, filepath.Join(dst, "a.txt")); got != "alpha" {
		t.Errorf("a.txt = %q", got)
	}
	for path, want := range map[string]os.FileMode{
		"bin/run.sh": 0o755, "deep/er/c": 0o600, "a.txt": 0o644, "empty": os.ModeDir | 0o700,
		"fifo": os.ModeNamedPipe | 0o640,
	} {
		info, err := os.Lstat(filepath.Join(dst, path))
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode() != want {
			t.Errorf("%s: mode %v, want %v", path, info.Mode(), want)
		}
	}
	if target, err := os.Readlink(filepath.Join(dst, "bin", "link")); err != nil || target != "../a.txt" {
		t.Errorf("symlink: %q %v", target, err)
	}
	a, _ := os.Stat(filepath.Join(dst, "a.txt"))
	hard, _ := os.Stat(filepath.Join(dst, "hard"))
	if !os.SameFile(a, hard) {
		t.Error("a hard link in the source became two files")
	}
	for _, p := range []string{"a.txt", "bin"} {
		info, _ := os.Stat(filepath.Join(dst, p))
		if !info.ModTime().Equal(old) {
			t.Errorf("%s: mtime %v, want %v", p, info.ModTime(), old)
		}
	}
}

func TestCopyTreeIsIndependentOfItsSource(t *testing.T) {
	src, dst := filepath.Join(t.TempDir(), "src"), filepath.Join(t.TempDir(), "dst")
	writeFile(t, filepath.Join(src, "f"), "before", 0o644)
	if _, err := copyTree(src, dst); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(src, "f"), "after!", 0o644)
	writeFile(t, filepath.Join(dst, "new"), "only in the copy", 0o644)
	if got := readFile(t, filepath.Join(dst, "f")); got != "before" {
		t.Errorf("the copy changed with its source: %q", got)
	}
	if _, err := os.Stat(filepath.Join(src, "new")); !os.IsNotExist(err) {
		t.Errorf("a file written in the copy appeared in the source: %v", err)
	}
}

func TestCopyTreeRefusesAnExistingTargetAndAFile(t *testing.T) {
	src := t.TempDir()
	if _, err := copyTree(src, t.TempDir()); err == nil {
		t.Error("copying onto an existing directory succeeded")
	}
	file := filepath.Join(src, "f")
	writeFile(t, file, "x", 0o644)
	if _, err := copyTree(file, filepath.Join(t.TempDir(), "dst")); err == nil {
		t.Error("copying a file as a tree succeeded")
	}
}

// The method reported matches what the filesystem under test can do. Set CSI_HOSTPATH_REFLINK_DIR to a
// directory on XFS or btrfs to exercise the reflink path.
func TestCopyTreeReportsReflinksWhereSupported(t *testing.T) {
	base := os.Getenv("CSI_HOSTPATH_REFLINK_DIR")
	if base == "" {
		base = t.TempDir()
	}
	supported, err := reflinkSupported(base)
	if err != nil {
		t.Fatal(err)
	}
	work, err := os.MkdirTemp(base, "copytree-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	writeFile(t, filepath.Join(work, "src", "big"), string(make([]byte, 1<<20)), 0o644)
	stats, err := copyTree(filepath.Join(work, "src"), filepath.Join(work, "dst"))
	if err != nil {
		t.Fatal(err)
	}
	want := "copy"
	if supported {
		want = "reflink"
	}
	if stats.Method() != want {
		t.Errorf("method %q on a filesystem where reflinks supported=%v", stats.Method(), supported)
	}
	t.Logf("%s: reflinks supported=%v", base, supported)
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`: "/plain", `/with\040space`: "/with space", `/tab\011x`: "/tab\tx", `/back\134slash`: `/back\slash`,
		`/trailing\04`: `/trailing\04`,
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}
