package main

// A minimal list-and-watch cache, in place of client-go's informers: list once, then follow a watch from
// the list's resourceVersion, and list again only when the watch cannot resume (410 Gone, or any error).
// Objects are decoded into the few fields the enforcer reads, so the cache stays small.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"sync"
	"time"
)

const (
	// watchTimeout is the timeoutSeconds asked of the server; the client gives up 30 s after it, which also
	// bounds how long a silently dead connection can hold a watch.
	watchTimeout = 60 * time.Second
	relistDelay  = time.Second
)

// errWatchExpired means the resourceVersion is too old to resume from: the cache must list again.
var errWatchExpired = errors.New("watch expired (410 Gone)")

type watchEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

type watchStatus struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// cache holds every object of one kind, keyed namespace/name, and pings changed after each update.
type cache[T kubeObject] struct {
	path    string // collection path, e.g. /api/v1/pods
	changed chan<- struct{}

	mu     sync.Mutex
	items  map[string]T
	synced bool
}

func newCache[T kubeObject](path string, changed chan<- struct{}) *cache[T] {
	return &cache[T]{path: path, changed: changed, items: map[string]T{}}
}

// snapshot returns the cached objects and whether a first list has completed.
func (c *cache[T]) snapshot() ([]T, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]T, 0, len(c.items))
	for _, item := range c.items {
		out = append(out, item)
	}
	return out, c.synced
}

func (c *cache[T]) notify() {
	select {
	case c.changed <- struct{}{}:
	default: // a wake-up is already pending
	}
}

// run lists and watches forever. On failure the cache keeps what it has, so the enforcer goes on
// enforcing the last known state until a new list succeeds.
func (c *cache[T]) run(api *apiClient) {
	for {
		rv, err := c.list(api)
		for err == nil {
			rv, err = c.watch(api, rv)
		}
		if !errors.Is(err, errWatchExpired) {
			log.Printf("netpol: %s: %v; listing again in %s", c.path, err, relistDelay)
		}
		time.Sleep(relistDelay)
	}
}

func (c *cache[T]) list(api *apiClient) (string, error) {
	resp, err := api.get(api.http, c.path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var list struct {
		Metadata objectMeta `json:"metadata"`
		Items    []T        `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return "", fmt.Errorf("list %s: %w", c.path, err)
	}
	items := make(map[string]T, len(list.Items))
	for _, item := range list.Items {
		items[objectKey(item.meta())] = item
	}
	c.mu.Lock()
	c.items, c.synced = items, true
	c.mu.Unlock()
	c.notify()
	return list.Metadata.ResourceVersion, nil
}

// watch follows one watch request and returns the resourceVersion to resume from. A nil error means the
// server ended the watch normally (its timeout) and it can be resumed.
func (c *cache[T]) watch(api *apiClient, rv string) (string, error) {
	path := fmt.Sprintf("%s?watch=1&allowWatchBookmarks=true&timeoutSeconds=%d&resourceVersion=%s",
		c.path, int(watchTimeout.Seconds()), rv)
	resp, err := api.get(api.watch, path)
	var httpErr *httpError
	if errors.As(err, &httpErr) && httpErr.code == http.StatusGone {
		return rv, errWatchExpired
	}
	if err != nil {
		return rv, err
	}
	defer resp.Body.Close()
	decoder := json.NewDecoder(resp.Body)
	for {
		var event watchEvent
		if err := decoder.Decode(&event); errors.Is(err, io.EOF) {
			return rv, nil
		} else if err != nil {
			return rv, fmt.Errorf("watch %s: %w", c.path, err)
		}
		if event.Type == "ERROR" {
			var status watchStatus
			_ = json.Unmarshal(event.Object, &status)
			if status.Code == http.StatusGone {
				return rv, errWatchExpired
			}
			return rv, fmt.Errorf("watch %s: %d %s", c.path, status.Code, status.Message)
		}
		var item T
		if err := json.Unmarshal(event.Object, &item); err != nil {
			return rv, fmt.Errorf("watch %s: %s event: %w", c.path, event.Type, err)
		}
		meta := item.meta()
		rv = meta.ResourceVersion
		c.mu.Lock()
		switch event.Type {
		case "ADDED", "MODIFIED":
			c.items[objectKey(meta)] = item
		case "DELETED":
			delete(c.items, objectKey(meta))
		}
		c.mu.Unlock()
		if event.Type != "BOOKMARK" {
			c.notify()
		}
	}
}
