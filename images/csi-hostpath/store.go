package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// The state directory holds one folder per volume and per snapshot:
//
//	STATE/volumes/<id>/data         the volume's files (what pods see)
//	STATE/volumes/<id>/volume.json  its record
//	STATE/snapshots/<id>/data       a copy of the source volume's data at snapshot time
//	STATE/snapshots/<id>/snapshot.json
//
// Both are built under STATE/tmp and renamed into place, so a crash never leaves a half-made volume or
// snapshot where a later call would take it for a finished one.
//
// IDs are derived from the CSI names (which the sidecars make unique and retry with), so a repeated
// CreateVolume/CreateSnapshot finds what the first call made: that is what makes the calls idempotent.

var (
	errNotFound      = errors.New("not found")
	errAlreadyExists = errors.New("already exists with different parameters")
)

type volumeRecord struct {
	ID            string `json:"id"`
	Name          string `json:"name"`
	CapacityBytes int64  `json:"capacityBytes"`
	// At most one of these is set: the content the volume was created from.
	SourceSnapshotID string    `json:"sourceSnapshotID,omitempty"`
	SourceVolumeID   string    `json:"sourceVolumeID,omitempty"`
	Method           string    `json:"method,omitempty"` // how the content was copied: reflink, copy, mixed
	Created          time.Time `json:"created"`
}

type snapshotRecord struct {
	ID             string    `json:"id"`
	Name           string    `json:"name"`
	SourceVolumeID string    `json:"sourceVolumeID"`
	SizeBytes      int64     `json:"sizeBytes"`
	Method         string    `json:"method"`
	Created        time.Time `json:"created"`
}

type store struct {
	root string
	// One lock for everything: operations are rare and a copy under the lock keeps a concurrent retry of
	// the same name from starting a second copy (it waits and then finds the first one's result).
	mu sync.Mutex
}

func newStore(root string) (*store, error) {
	for _, dir := range []string{"volumes", "snapshots", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o750); err != nil {
			return nil, err
		}
	}
	// Leftovers of calls interrupted by a crash.
	entries, err := os.ReadDir(filepath.Join(root, "tmp"))
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(root, "tmp", e.Name())); err != nil {
			return nil, err
		}
	}
	return &store{root: root}, nil
}

func idFor(prefix, name string) string {
	sum := sha256.Sum256([]byte(name))
	return prefix + hex.EncodeToString(sum[:12])
}

func (s *store) volumeDir(id string) string   { return filepath.Join(s.root, "volumes", id) }
func (s *store) snapshotDir(id string) string { return filepath.Join(s.root, "snapshots", id) }

// VolumePath is the directory a pod sees for the volume.
func (s *store) VolumePath(id string) string { return filepath.Join(s.volumeDir(id), "data") }

// validID keeps IDs that come from requests from naming paths outside the state directory.
func validID(id string) bool {
	return id != "" && id == filepath.Base(id) && id != "." && id != ".."
}

func readRecord(path string, into any) error {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return errNotFound
	}
	if err != nil {
		return err
	}
	return json.Unmarshal(data, into)
}

// build makes a new folder under tmp, lets fill populate it, writes the record and renames the folder to
// final. On any error the folder is removed.
func (s *store) build(final, recordName string, fill func(dir string) (any, error)) error {
	dir, err := os.MkdirTemp(filepath.Join(s.root, "tmp"), "build-")
	if err != nil {
		return err
	}
	record, err := fill(dir)
	if err == nil {
		var data []byte
		if data, err = json.MarshalIndent(record, "", "  "); err == nil {
			err = os.WriteFile(filepath.Join(dir, recordName), data, 0o640)
		}
	}
	if err == nil {
		err = os.Rename(dir, final)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
	}
	return err
}

// GetVolume returns the volume's record or errNotFound.
func (s *store) GetVolume(id string) (volumeRecord, error) {
	var rec volumeRecord
	if !validID(id) {
		return rec, errNotFound
	}
	err := readRecord(filepath.Join(s.volumeDir(id), "volume.json"), &rec)
	return rec, err
}

// GetSnapshot returns the snapshot's record or errNotFound.
func (s *store) GetSnapshot(id string) (snapshotRecord, error) {
	var rec snapshotRecord
	if !validID(id) {
		return rec, errNotFound
	}
	err := readRecord(filepath.Join(s.snapshotDir(id), "snapshot.json"), &rec)
	return rec, err
}

// CreateVolume makes the volume called name, empty or with the content of a snapshot or another volume
// (at most one of sourceSnapshotID, sourceVolumeID). A volume of that name that already exists is
// returned when it was asked for with the same capacity and source, errAlreadyExists otherwise; a missing
// source is errNotFound.
func (s *store) CreateVolume(name string, capacity int64, sourceSnapshotID, sourceVolumeID string) (volumeRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := idFor("vol-", name)
	if existing, err := s.GetVolume(id); err == nil {
		if existing.Name != name || existing.CapacityBytes != capacity ||
			existing.SourceSnapshotID != sourceSnapshotID || existing.SourceVolumeID != sourceVolumeID {
			return existing, errAlreadyExists
		}
		return existing, nil
	} else if !errors.Is(err, errNotFound) {
		return volumeRecord{}, err
	}
	var from string
	switch {
	case sourceSnapshotID != "":
		if _, err := s.GetSnapshot(sourceSnapshotID); err != nil {
			return volumeRecord{}, fmt.Errorf("snapshot %s: %w", sourceSnapshotID, err)
		}
		from = filepath.Join(s.snapshotDir(sourceSnapshotID), "data")
	case sourceVolumeID != "":
		if _, err := s.GetVolume(sourceVolumeID); err != nil {
			return volumeRecord{}, fmt.Errorf("volume %s: %w", sourceVolumeID, err)
		}
		from = s.VolumePath(sourceVolumeID)
	}
	rec := volumeRecord{
		ID: id, Name: name, CapacityBytes: capacity,
		SourceSnapshotID: sourceSnapshotID, SourceVolumeID: sourceVolumeID, Created: time.Now().UTC(),
	}
	err := s.build(s.volumeDir(id), "volume.json", func(dir string) (any, error) {
		data := filepath.Join(dir, "data")
		if from == "" {
			// World-writable like an emptyDir: pods of any user can use a fresh volume (fsGroup may narrow it).
			if err := os.Mkdir(data, 0o777); err != nil {
				return nil, err
			}
			return rec, os.Chmod(data, 0o777)
		}
		stats, err := copyTree(from, data)
		rec.Method = stats.Method()
		return rec, err
	})
	return rec, err
}

// DeleteVolume removes the volume; a missing one is not an error (deletes are retried).
func (s *store) DeleteVolume(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !validID(id) {
		return nil
	}
	return s.remove(s.volumeDir(id))
}

// remove renames dir into tmp first, so a crash halfway through leaves no partial volume or snapshot.
func (s *store) remove(dir string) error {
	trash, err := os.MkdirTemp(filepath.Join(s.root, "tmp"), "delete-")
	if err != nil {
		return err
	}
	if err := os.Rename(dir, filepath.Join(trash, "x")); err != nil && !errors.Is(err, os.ErrNotExist) {
		_ = os.Remove(trash)
		return err
	}
	return os.RemoveAll(trash)
}

// CreateSnapshot copies the source volume's data into a new snapshot called name. A snapshot of that name
// is returned when it has the same source, errAlreadyExists otherwise; a missing source is errNotFound.
func (s *store) CreateSnapshot(name, sourceVolumeID string) (snapshotRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := idFor("snap-", name)
	if existing, err := s.GetSnapshot(id); err == nil {
		if existing.Name != name || existing.SourceVolumeID != sourceVolumeID {
			return existing, errAlreadyExists
		}
		return existing, nil
	} else if !errors.Is(err, errNotFound) {
		return snapshotRecord{}, err
	}
	if _, err := s.GetVolume(sourceVolumeID); err != nil {
		return snapshotRecord{}, fmt.Errorf("volume %s: %w", sourceVolumeID, err)
	}
	rec := snapshotRecord{ID: id, Name: name, SourceVolumeID: sourceVolumeID, Created: time.Now().UTC()}
	err := s.build(s.snapshotDir(id), "snapshot.json", func(dir string) (any, error) {
		stats, err := copyTree(s.VolumePath(sourceVolumeID), filepath.Join(dir, "data"))
		rec.SizeBytes, rec.Method = stats.Bytes, stats.Method()
		return rec, err
	})
	return rec, err
}

// DeleteSnapshot removes the snapshot; a missing one is not an error. Volumes made from it are copies and
// stay intact.
func (s *store) DeleteSnapshot(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !validID(id) {
		return nil
	}
	return s.remove(s.snapshotDir(id))
}

// ListSnapshots returns every snapshot, ordered by ID (a stable order for paging).
func (s *store) ListSnapshots() ([]snapshotRecord, error) {
	entries, err := os.ReadDir(filepath.Join(s.root, "snapshots"))
	if err != nil {
		return nil, err
	}
	var out []snapshotRecord
	for _, e := range entries {
		rec, err := s.GetSnapshot(e.Name())
		if errors.Is(err, errNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
