package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func newTestStore(t *testing.T) *store {
	t.Helper()
	s, err := newStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustVolume(t *testing.T, s *store, name, fromSnapshot, fromVolume string) volumeRecord {
	t.Helper()
	rec, err := s.CreateVolume(name, 1<<20, fromSnapshot, fromVolume)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func TestCreateVolumeIsIdempotentByName(t *testing.T) {
	s := newTestStore(t)
	first := mustVolume(t, s, "pvc-1", "", "")
	writeFile(t, filepath.Join(s.VolumePath(first.ID), "work"), "kept", 0o644)
	again := mustVolume(t, s, "pvc-1", "", "")
	if again.ID != first.ID {
		t.Fatalf("second create made %s, first %s", again.ID, first.ID)
	}
	if got := readFile(t, filepath.Join(s.VolumePath(first.ID), "work")); got != "kept" {
		t.Errorf("a repeated create touched the volume: %q", got)
	}
	if _, err := s.CreateVolume("pvc-1", 2<<20, "", ""); !errors.Is(err, errAlreadyExists) {
		t.Errorf("same name, other capacity: %v, want errAlreadyExists", err)
	}
	info, err := os.Stat(s.VolumePath(first.ID))
	if err != nil || info.Mode().Perm() != 0o777 {
		t.Errorf("a new volume should be writable by any pod user: %v %v", info.Mode(), err)
	}
}

func TestSnapshotIsAPointInTimeCopy(t *testing.T) {
	s := newTestStore(t)
	vol := mustVolume(t, s, "source", "", "")
	writeFile(t, filepath.Join(s.VolumePath(vol.ID), "src", "main.go"), "package main // v1\n", 0o644)
	snap, err := s.CreateSnapshot("snap-1", vol.ID)
	if err != nil {
		t.Fatal(err)
	}
	if snap.SourceVolumeID != vol.ID || snap.SizeBytes != int64(len("package main // v1\n")) {
		t.Errorf("snapshot record %+v", snap)
	}
	if snap.Method != "copy" && snap.Method != "reflink" {
		t.Errorf("method %q", snap.Method)
	}
	// Work after the snapshot is not in it.
	writeFile(t, filepath.Join(s.VolumePath(vol.ID), "src", "main.go"), "package main // v2\n", 0o644)
	restored := mustVolume(t, s, "restored", snap.ID, "")
	if got := readFile(t, filepath.Join(s.VolumePath(restored.ID), "src", "main.go")); got != "package main // v1\n" {
		t.Errorf("restored volume has %q", got)
	}
	// Idempotent by name; another source under the same name is a conflict.
	if again, err := s.CreateSnapshot("snap-1", vol.ID); err != nil || again != snap {
		t.Errorf("repeated snapshot: %+v %v", again, err)
	}
	other := mustVolume(t, s, "other", "", "")
	if _, err := s.CreateSnapshot("snap-1", other.ID); !errors.Is(err, errAlreadyExists) {
		t.Errorf("same name, other source: %v", err)
	}
}

func TestClonesAreIndependent(t *testing.T) {
	s := newTestStore(t)
	src := mustVolume(t, s, "baseline", "", "")
	writeFile(t, filepath.Join(s.VolumePath(src.ID), "f"), "base", 0o644)
	snap, err := s.CreateSnapshot("baseline-snap", src.ID)
	if err != nil {
		t.Fatal(err)
	}
	var clones []volumeRecord
	for _, name := range []string{"clone-a", "clone-b", "clone-c"} {
		clones = append(clones, mustVolume(t, s, name, snap.ID, ""))
	}
	clones = append(clones, mustVolume(t, s, "clone-of-volume", "", src.ID))
	writeFile(t, filepath.Join(s.VolumePath(clones[0].ID), "f"), "changed in a", 0o644)
	for _, c := range clones[1:] {
		if got := readFile(t, filepath.Join(s.VolumePath(c.ID), "f")); got != "base" {
			t.Errorf("%s sees %q", c.Name, got)
		}
	}
	if got := readFile(t, filepath.Join(s.VolumePath(src.ID), "f")); got != "base" {
		t.Errorf("the source sees %q", got)
	}
	// Deleting the clones and the snapshot leaves the source intact.
	for _, c := range clones {
		if err := s.DeleteVolume(c.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteSnapshot(snap.ID); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(s.VolumePath(src.ID), "f")); got != "base" {
		t.Errorf("the source after deleting its clones: %q", got)
	}
}

func TestMissingSourcesAreNotFound(t *testing.T) {
	s := newTestStore(t)
	if _, err := s.CreateVolume("v", 0, "snap-missing", ""); !errors.Is(err, errNotFound) {
		t.Errorf("from a missing snapshot: %v", err)
	}
	if _, err := s.CreateVolume("v", 0, "", "vol-missing"); !errors.Is(err, errNotFound) {
		t.Errorf("from a missing volume: %v", err)
	}
	if _, err := s.CreateSnapshot("s", "vol-missing"); !errors.Is(err, errNotFound) {
		t.Errorf("snapshot of a missing volume: %v", err)
	}
	if _, err := s.GetVolume("../../etc"); !errors.Is(err, errNotFound) {
		t.Errorf("a path as an ID: %v", err)
	}
	// Deletes of what does not exist succeed: the sidecars retry them.
	if err := s.DeleteVolume("vol-missing"); err != nil {
		t.Error(err)
	}
	if err := s.DeleteSnapshot("snap-missing"); err != nil {
		t.Error(err)
	}
}

func TestFailedBuildsLeaveNothingBehind(t *testing.T) {
	s := newTestStore(t)
	src := mustVolume(t, s, "src", "", "")
	writeFile(t, filepath.Join(s.VolumePath(src.ID), "f"), "x", 0o644)
	// Something in the way of the final rename makes the build fail after the copy.
	id := idFor("snap-", "s")
	writeFile(t, filepath.Join(s.snapshotDir(id), "in-the-way"), "", 0o644)
	if _, err := s.CreateSnapshot("s", src.ID); err == nil {
		t.Fatal("the snapshot succeeded although its folder could not be put in place")
	}
	if _, err := s.GetSnapshot(id); !errors.Is(err, errNotFound) {
		t.Errorf("a failed snapshot left a record: %v", err)
	}
	if entries, _ := os.ReadDir(filepath.Join(s.root, "tmp")); len(entries) != 0 {
		t.Errorf("tmp holds %d leftovers", len(entries))
	}
}

func TestNewStoreClearsInterruptedBuilds(t *testing.T) {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "tmp", "build-123", "data", "half"), "x", 0o644)
	if _, err := newStore(root); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(filepath.Join(root, "tmp")); len(entries) != 0 {
		t.Errorf("tmp still holds %v", entries)
	}
}

func TestListSnapshotsIsOrderedByID(t *testing.T) {
	s := newTestStore(t)
	vol := mustVolume(t, s, "v", "", "")
	for _, name := range []string{"c", "a", "b"} {
		if _, err := s.CreateSnapshot(name, vol.ID); err != nil {
			t.Fatal(err)
		}
	}
	list, err := s.ListSnapshots()
	if err != nil || len(list) != 3 {
		t.Fatalf("%v %v", list, err)
	}
	for i := 1; i < len(list); i++ {
		if list[i-1].ID >= list[i].ID {
			t.Errorf("not ordered: %s before %s", list[i-1].ID, list[i].ID)
		}
	}
}
