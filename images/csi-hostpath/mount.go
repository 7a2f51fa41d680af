package main

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// mounter is what NodePublish/NodeUnpublish need from the kernel; tests substitute a fake.
type mounter interface {
	Bind(source, target string, readOnly bool) error
	Unmount(target string) error
	IsMountPoint(path string) (bool, error)
}

type linuxMounter struct{}

func (linuxMounter) Bind(source, target string, readOnly bool) error {
	if err := syscall.Mount(source, target, "", syscall.MS_BIND, ""); err != nil {
		return err
	}
	if !readOnly {
		return nil
	}
	// A bind mount takes its flags from the source: read-only needs a remount of the new mount.
	flags := uintptr(syscall.MS_BIND | syscall.MS_REMOUNT | syscall.MS_RDONLY)
	if err := syscall.Mount("", target, "", flags, ""); err != nil {
		_ = syscall.Unmount(target, 0)
		return err
	}
	return nil
}

func (linuxMounter) Unmount(target string) error { return syscall.Unmount(target, 0) }

// IsMountPoint reports whether path is a mount point in this mount namespace. /proc/self/mountinfo is
// read rather than comparing device numbers with the parent, because a bind mount of a directory on the
// same filesystem has the same device as its parent.
func (linuxMounter) IsMountPoint(path string) (bool, error) {
	resolved, err := filepath.EvalSymlinks(path)
	if os.IsNotExist(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 64*1024), 1024*1024)
	for scanner.Scan() {
		// Fields: mount ID, parent ID, major:minor, root, mount point, ... (proc(5)).
		fields := strings.Fields(scanner.Text())
		if len(fields) > 4 && unescapeMountinfo(fields[4]) == resolved {
			return true, nil
		}
	}
	return false, scanner.Err()
}

// unescapeMountinfo undoes the octal escapes (\040 for a space, ...) the kernel writes in mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) && isOctal(s[i+1:i+4]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(s string) bool {
	for _, c := range []byte(s) {
		if c < '0' || c > '7' {
			return false
		}
	}
	return true
}
