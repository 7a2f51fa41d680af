package main

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// ficlone is FICLONE from linux/fs.h (_IOW(0x94, 9, int)): make dst share src's extents (a reflink).
const ficlone = 0x40049409

// copyStats says what a tree copy did: Reflinked files share their blocks with the source until either
// side writes; Copied files were read and written in full.
type copyStats struct {
	Files     int
	Reflinked int
	Copied    int
	Bytes     int64 // apparent size of the regular files
}

// Method is "reflink" when every regular file was reflinked, "copy" when none was, "mixed" otherwise.
func (s copyStats) Method() string {
	switch {
	case s.Copied == 0 && s.Reflinked > 0:
		return "reflink"
	case s.Reflinked == 0:
		return "copy"
	default:
		return "mixed"
	}
}

// copyTree copies the tree at src into dst, which must not exist, the way `cp -a --reflink=auto` does:
// regular files are reflinked where the filesystem supports it and copied otherwise; directories,
// symlinks, FIFOs and device nodes are recreated; hard links within the tree stay hard links; mode,
// ownership and modification times are kept. Sockets are skipped (nothing can reuse them) and extended
// attributes are not copied (workspaces do not rely on them).
func copyTree(src, dst string) (copyStats, error) {
	var stats copyStats
	root, err := os.Lstat(src)
	if err != nil {
		return stats, err
	}
	if !root.IsDir() {
		return stats, fmt.Errorf("%s is not a directory", src)
	}
	links := map[fileID]string{} // first copy of each multiply-linked inode
	var dirs []dirTimes           // directory times are set last: creating entries changes them
	err = filepath.WalkDir(src, func(path string, d fs.DirEntry, walkErr error) error {
		if walkErr != nil {
			return walkErr
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat information", path)
		}
		mode := info.Mode()
		switch {
		case mode.IsDir():
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, dirTimes{target, info.ModTime()})
		case mode.IsRegular():
			id := fileID{st.Dev, st.Ino}
			if first, seen := links[id]; seen {
				return os.Link(first, target)
			}
			reflinked, err := copyFile(path, target)
			if err != nil {
				return err
			}
			stats.Files++
			stats.Bytes += info.Size()
			if reflinked {
				stats.Reflinked++
			} else {
				stats.Copied++
			}
			if st.Nlink > 1 {
				links[id] = target
			}
		case mode&fs.ModeSymlink != 0:
			dest, err := os.Readlink(path)
			if err != nil {
				return err
			}
			if err := os.Symlink(dest, target); err != nil {
				return err
			}
			return os.Lchown(target, int(st.Uid), int(st.Gid))
		case mode&fs.ModeSocket != 0:
			return nil
		default: // FIFOs and device nodes
			if err := syscall.Mknod(target, st.Mode, int(st.Rdev)); err != nil {
				return fmt.Errorf("mknod %s: %w", target, err)
			}
		}
		return applyMetadata(target, info, st)
	})
	if err != nil {
		return stats, err
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Chtimes(dirs[i].path, dirs[i].mtime, dirs[i].mtime); err != nil {
			return stats, err
		}
	}
	return stats, nil
}

type fileID struct {
	dev uint64
	ino uint64
}

type dirTimes struct {
	path  string
	mtime time.Time
}

// applyMetadata sets ownership, then mode (chown clears setuid/setgid bits), then times.
func applyMetadata(target string, info fs.FileInfo, st *syscall.Stat_t) error {
	if err := os.Lchown(target, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := os.Chmod(target, info.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
		return err
	}
	return os.Chtimes(target, info.ModTime(), info.ModTime())
}

// copyFile creates dst with src's content: a reflink when the filesystem can, else a byte copy (which Go
// does with copy_file_range, itself sharing blocks on filesystems that support it).
func copyFile(src, dst string) (reflinked bool, err error) {
	in, err := os.Open(src)
	if err != nil {
		return false, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return false, err
	}
	defer func() {
		if closeErr := out.Close(); err == nil {
			err = closeErr
		}
	}()
	if reflink(out, in) == nil {
		return true, nil
	}
	_, err = io.Copy(out, in)
	return false, err
}

func reflink(dst, src *os.File) error {
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, dst.Fd(), ficlone, src.Fd())
	if errno != 0 {
		return errno
	}
	return nil
}

// reflinkSupported probes dir's filesystem with a one-byte file, for the startup log and the README's claim.
func reflinkSupported(dir string) (bool, error) {
	tmp, err := os.MkdirTemp(dir, ".reflink-probe-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "src")
	if err := os.WriteFile(src, []byte{1}, 0o600); err != nil {
		return false, err
	}
	reflinked, err := copyFile(src, filepath.Join(tmp, "dst"))
	return reflinked, err
}
