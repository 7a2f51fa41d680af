package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func testAPI(t *testing.T, handler http.HandlerFunc) *apiClient {
	t.Helper()
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		handler(w, r)
	}))
	t.Cleanup(server.Close)
	return &apiClient{base: server.URL, tokenPath: token, http: server.Client(), watch: server.Client()}
}

func podJSON(name, rv string) string {
	return fmt.Sprintf(`{"metadata":{"namespace":"a","name":%q,"resourceVersion":%q},"status":{"podIPs":[{"ip":"10.244.0.5"}]}}`, name, rv)
}

func keys(c *cache[pod]) []string {
	items, _ := c.snapshot()
	var out []string
	for _, p := range items {
		out = append(out, p.Metadata.Name)
	}
	slices.Sort(out)
	return out
}

func TestCacheListThenWatch(t *testing.T) {
	api := testAPI(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Query().Get("watch") != "1":
			fmt.Fprintf(w, `{"metadata":{"resourceVersion":"10"},"items":[%s,%s]}`, podJSON("one", "8"), podJSON("two", "9"))
		case r.URL.Query().Get("resourceVersion") == "10":
			fmt.Fprintf(w, `{"type":"ADDED","object":%s}`+"\n", podJSON("three", "11"))
			fmt.Fprintf(w, `{"type":"DELETED","object":%s}`+"\n", podJSON("one", "12"))
			fmt.Fprint(w, `{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"13"}}}`+"\n")
		case r.URL.Query().Get("resourceVersion") == "13":
			fmt.Fprint(w, `{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old resource version"}}`+"\n")
		case r.URL.Query().Get("resourceVersion") == "99":
			http.Error(w, "gone", http.StatusGone)
		default:
			http.Error(w, "unexpected", http.StatusInternalServerError)
		}
	})
	changed := make(chan struct{}, 1)
	c := newCache[pod]("/api/v1/pods", changed)
	if _, synced := c.snapshot(); synced {
		t.Fatal("synced before listing")
	}
	rv, err := c.list(api)
	if err != nil || rv != "10" {
		t.Fatalf("list: %q %v", rv, err)
	}
	if got := keys(c); strings.Join(got, ",") != "one,two" {
		t.Fatalf("after list: %v", got)
	}
	<-changed
	rv, err = c.watch(api, rv)
	if err != nil || rv != "13" {
		t.Fatalf("watch: %q %v", rv, err)
	}
	if got := keys(c); strings.Join(got, ",") != "three,two" {
		t.Fatalf("after watch: %v", got)
	}
	if _, err := c.watch(api, "13"); !errors.Is(err, errWatchExpired) {
		t.Errorf("ERROR 410 event: %v", err)
	}
	if _, err := c.watch(api, "99"); !errors.Is(err, errWatchExpired) {
		t.Errorf("HTTP 410: %v", err)
	}
	if _, err := c.watch(api, "1"); err == nil || errors.Is(err, errWatchExpired) {
		t.Errorf("HTTP 500: %v", err)
	}
	if got := keys(c); strings.Join(got, ",") != "three,two" {
		t.Errorf("failed watches changed the cache: %v", got)
	}
}

func TestCacheListFailureKeepsItems(t *testing.T) {
	fail := false
	api := testAPI(t, func(w http.ResponseWriter, r *http.Request) {
		if fail {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, `{"metadata":{"resourceVersion":"1"},"items":[%s]}`, podJSON("one", "1"))
	})
	c := newCache[pod]("/api/v1/pods", make(chan struct{}, 1))
	if _, err := c.list(api); err != nil {
		t.Fatal(err)
	}
	fail = true
	if _, err := c.list(api); err == nil {
		t.Fatal("list against a failing server succeeded")
	}
	if items, synced := c.snapshot(); len(items) != 1 || !synced {
		t.Errorf("after a failed list: %d items, synced=%v", len(items), synced)
	}
}
