package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/trellis-net/trellis/internal/netpol"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-logr/logr"

	"github.com/trellis-net/trellis/internal/cnicontract"
)

// Announcements are kept as one file per host veth: written when the plugin asks,
// removed when the veth is gone.
func announcementPath(dir, iface string) string {
	return filepath.Join(dir, iface+".json")
}

func saveAnnouncement(dir string, a netpol.Announcement) error {
	if dir == "" {
		return nil
	}
	if !strings.HasPrefix(a.Iface, cnicontract.HostVethPrefix) || strings.ContainsAny(a.Iface, `/\`) {
		return fmt.Errorf("host interface %q is not a trellis pod veth", a.Iface)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("writing the netpol.Announcement of %s: %w", a.Iface, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), announcementPath(dir, a.Iface)); err != nil {
		return fmt.Errorf("writing the netpol.Announcement of %s: %w", a.Iface, err)
	}
	return nil
}

func removeAnnouncement(dir, iface string, log logr.Logger) {
	if dir == "" {
		return
	}
	if err := os.Remove(announcementPath(dir, iface)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		log.Error(err, "removing a pod netpol.Announcement", "interface", iface)
	}
}

// loadAnnouncements reads what an earlier agent recorded; unreadable files are skipped
// (their veths are then judged by the API server's copy).
func loadAnnouncements(dir string, log logr.Logger) []netpol.Announcement {
	if dir == "" {
		return nil
	}
	files, err := filepath.Glob(filepath.Join(dir, cnicontract.HostVethPrefix+"*.json"))
	if err != nil {
		return nil
	}
	var out []netpol.Announcement
	for _, f := range files {
		b, err := os.ReadFile(f)
		var a netpol.Announcement
		if err == nil {
			err = json.Unmarshal(b, &a)
		}
		if err != nil || a.Iface+".json" != filepath.Base(f) || !a.IP.IsValid() {
			log.Error(err, "ignoring an unreadable pod netpol.Announcement", "file", f)
			continue
		}
		out = append(out, a)
	}
	return out
}
