// Package kubetest is a Kubernetes API server for tests that serves Node
// objects over HTTP on loopback: list, get and watch as client-go's
// informers use them (resourceVersions, bookmarks, watch-list initial
// events, "too old resource version" after a restart). Tests change the
// nodes with Apply and Delete, and stop and restart the server on the same
// address to see a client recover. No etcd, no other resource.
package kubetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

type event struct {
	typ  watch.EventType
	node corev1.Node
	rv   int64
}

// Server serves /api/v1/nodes.
type Server struct {
	mu      sync.Mutex
	nodes   map[string]corev1.Node
	rv      int64
	log     []event // every change since firstRV
	firstRV int64   // a watch from before this resourceVersion is expired
	subs    map[chan event]struct{}
	addr    string
	srv     *http.Server
	stopped chan struct{} // closed by Stop: ends every watch
	// Requests counts the requests served, by "verb" (list, watch, get).
	Requests map[string]int
}

// New starts a server on a free loopback port.
func New() (*Server, error) {
	s := &Server{nodes: map[string]corev1.Node{}, rv: 1, firstRV: 1, subs: map[chan event]struct{}{}, Requests: map[string]int{}}
	if err := s.listen("127.0.0.1:0"); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) listen(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	s.addr = l.Addr().String()
	s.stopped = make(chan struct{})
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(l) }()
	return nil
}

// Config is a client configuration for the server.
func (s *Server) Config() *rest.Config {
	return &rest.Config{Host: "http://" + s.addr, QPS: -1}
}

// Stop closes the listener and every connection, as a crashing API server
// does; the nodes stay and can still be changed. Its watch history is
// lost: after Start, a watch from an older resourceVersion is expired.
func (s *Server) Stop() {
	s.mu.Lock()
	close(s.stopped)
	srv := s.srv
	s.log, s.firstRV = nil, s.rv+1
	s.mu.Unlock()
	_ = srv.Close()
}

// Start serves again on the address of before.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listen(s.addr)
}

// Close stops the server for good.
func (s *Server) Close() {
	s.mu.Lock()
	srv := s.srv
	select {
	case <-s.stopped:
	default:
		close(s.stopped)
	}
	s.mu.Unlock()
	_ = srv.Close()
}

// Apply creates or replaces a node.
func (s *Server) Apply(n *corev1.Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	typ := watch.Added
	if _, ok := s.nodes[n.Name]; ok {
		typ = watch.Modified
	}
	c := *n.DeepCopy()
	s.rv++
	c.ResourceVersion = strconv.FormatInt(s.rv, 10)
	if c.UID == "" {
		c.UID = types.UID("uid-" + c.Name)
	}
	s.nodes[c.Name] = c
	s.publish(event{typ, c, s.rv})
}

// Delete removes a node; false if there was none.
func (s *Server) Delete(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[name]
	if !ok {
		return false
	}
	delete(s.nodes, name)
	s.rv++
	n.ResourceVersion = strconv.FormatInt(s.rv, 10)
	s.publish(event{watch.Deleted, n, s.rv})
	return true
}

func (s *Server) publish(e event) {
	s.log = append(s.log, e)
	for ch := range s.subs {
		select {
		case ch <- e:
		default:
			// A watcher this far behind is dropped, as the API server
			// drops slow watchers; the client lists again.
			delete(s.subs, ch)
			close(ch)
		}
	}
}

func withKind(n corev1.Node) corev1.Node {
	n.TypeMeta = metav1.TypeMeta{Kind: "Node", APIVersion: "v1"}
	return n
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		writeStatus(w, http.StatusMethodNotAllowed, "MethodNotAllowed", "only reads are served")
		return
	}
	path := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case path == "/api/v1/nodes" && r.URL.Query().Get("watch") == "true":
		s.count("watch")
		s.watch(w, r)
	case path == "/api/v1/nodes":
		s.count("list")
		s.list(w)
	case strings.HasPrefix(path, "/api/v1/nodes/"):
		s.count("get")
		s.get(w, strings.TrimPrefix(path, "/api/v1/nodes/"))
	case emptyKinds[path] != [2]string{}:
		s.empty(w, r, emptyKinds[path])
	default:
		writeStatus(w, http.StatusNotFound, "NotFound", "the server could not find the requested resource")
	}
}

// emptyKinds are the resources the agent's NetworkPolicy controller
// watches besides nodes, by path: served empty (kind, apiVersion), so that
// agents started against this server sync instead of retrying 404s.
var emptyKinds = map[string][2]string{
	"/api/v1/pods":       {"Pod", "v1"},
	"/api/v1/namespaces": {"Namespace", "v1"},
	"/apis/networking.k8s.io/v1/networkpolicies": {"NetworkPolicy", "networking.k8s.io/v1"},
}

// empty lists none of kind, and watches for nothing (a watch-list gets the
// bookmark that ends its initial events) until the client or the server
// stops.
func (s *Server) empty(w http.ResponseWriter, r *http.Request, kind [2]string) {
	s.mu.Lock()
	rv := strconv.FormatInt(s.rv, 10)
	stopped := s.stopped
	s.mu.Unlock()
	if r.URL.Query().Get("watch") != "true" {
		s.count("list")
		writeJSON(w, http.StatusOK, map[string]any{"kind": kind[0] + "List", "apiVersion": kind[1],
			"metadata": map[string]any{"resourceVersion": rv}, "items": []any{}})
		return
	}
	s.count("watch")
	flusher, ok := w.(http.Flusher)
	if !ok {
		writeStatus(w, http.StatusInternalServerError, "InternalError", "no streaming")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	if r.URL.Query().Get("sendInitialEvents") == "true" {
		obj, _ := json.Marshal(map[string]any{"kind": kind[0], "apiVersion": kind[1], "metadata": map[string]any{"resourceVersion": rv,
			"annotations": map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
		_ = json.NewEncoder(w).Encode(metav1.WatchEvent{Type: string(watch.Bookmark), Object: runtime.RawExtension{Raw: obj}})
		flusher.Flush()
	}
	select {
	case <-stopped:
	case <-r.Context().Done():
	case <-time.After(5 * time.Minute):
	}
}

func (s *Server) count(verb string) {
	s.mu.Lock()
	s.Requests[verb]++
	s.mu.Unlock()
}

// Count is how many requests of verb were served.
func (s *Server) Count(verb string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Requests[verb]
}

func (s *Server) sorted() []corev1.Node {
	var out []corev1.Node
	for _, n := range s.nodes {
		out = append(out, withKind(n))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (s *Server) list(w http.ResponseWriter) {
	s.mu.Lock()
	l := corev1.NodeList{TypeMeta: metav1.TypeMeta{Kind: "NodeList", APIVersion: "v1"}, ListMeta: metav1.ListMeta{ResourceVersion: strconv.FormatInt(s.rv, 10)}, Items: s.sorted()}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, l)
}

func (s *Server) get(w http.ResponseWriter, name string) {
	s.mu.Lock()
	n, ok := s.nodes[name]
	s.mu.Unlock()
	if !ok {
		writeStatus(w, http.StatusNotFound, "NotFound", fmt.Sprintf("nodes %q not found", name))
		return
	}
	writeJSON(w, http.StatusOK, withKind(n))
}

func (s *Server) watch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	from, timeout, err := watchOptions(q)
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		writeStatus(w, http.StatusInternalServerError, "InternalError", "no streaming")
		return
	}
	sub := s.subscribe(from, q.Get("sendInitialEvents") == "true")
	defer s.unsubscribe(sub.ch)

	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	send := func(typ watch.EventType, obj any) error {
		b, err := json.Marshal(obj)
		if err != nil {
			return err
		}
		if err := enc.Encode(metav1.WatchEvent{Type: string(typ), Object: runtime.RawExtension{Raw: b}}); err != nil {
			return err
		}
		flusher.Flush()
		return nil
	}
	if sub.expired {
		// What the API server sends for a resourceVersion it no longer has.
		_ = send(watch.Error, metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
			Reason: metav1.StatusReasonExpired, Code: http.StatusGone, Message: fmt.Sprintf("too old resource version: %d", from)})
		return
	}
	for _, e := range sub.backlog {
		if send(e.typ, withKind(e.node)) != nil {
			return
		}
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case e, ok := <-sub.ch:
			if !ok || send(e.typ, withKind(e.node)) != nil {
				return
			}
		case <-deadline.C:
			return
		case <-sub.stopped:
			return
		case <-r.Context().Done():
			return
		}
	}
}

// watchOptions reads a watch's resourceVersion (0 without one) and its
// timeoutSeconds (5 minutes without a positive one).
func watchOptions(q url.Values) (from int64, timeout time.Duration, err error) {
	if v := q.Get("resourceVersion"); v != "" {
		if from, err = strconv.ParseInt(v, 10, 64); err != nil {
			return 0, 0, errors.New("bad resourceVersion " + v)
		}
	}
	timeout = 5 * time.Minute
	if v := q.Get("timeoutSeconds"); v != "" {
		if sec, err := strconv.Atoi(v); err == nil && sec > 0 {
			timeout = time.Duration(sec) * time.Second
		}
	}
	return from, timeout, nil
}

// subscription is where a watch starts: the events it sends first, then
// those on ch until stopped; expired if from is older than the history
// (then nothing is subscribed).
type subscription struct {
	backlog []event
	ch      chan event
	stopped chan struct{}
	expired bool
}

// subscribe starts a watch from resourceVersion from, or with the current
// state (initial: watch-list).
func (s *Server) subscribe(from int64, initial bool) subscription {
	s.mu.Lock()
	defer s.mu.Unlock()
	sub := subscription{ch: make(chan event, 256), stopped: s.stopped}
	switch {
	case initial:
		// Watch-list: the current state as ADDED events, then a bookmark
		// that marks their end.
		for _, n := range s.sorted() {
			sub.backlog = append(sub.backlog, event{watch.Added, n, s.rv})
		}
		end := corev1.Node{ObjectMeta: metav1.ObjectMeta{ResourceVersion: strconv.FormatInt(s.rv, 10), Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
		sub.backlog = append(sub.backlog, event{watch.Bookmark, end, s.rv})
	case from != 0 && from < s.firstRV:
		sub.expired = true
		return sub
	default:
		for _, e := range s.log {
			if e.rv > from {
				sub.backlog = append(sub.backlog, e)
			}
		}
	}
	s.subs[sub.ch] = struct{}{}
	return sub
}

// unsubscribe ends a watch's subscription, if it has one.
func (s *Server) unsubscribe(ch chan event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.subs, ch)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	writeJSON(w, code, metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Reason: reason, Code: int32(code), Message: msg})
}
