// Command hf-hub stands in for huggingface.co inside the test cluster: it serves model
// repositories over the Hub's file API, so a model download Job runs its real
// huggingface_hub client against it (HF_ENDPOINT) without leaving the machine.
//
// One repository, held in memory: --repo ORG/NAME with --files N small files of
// deterministic content (config.json, tokenizer_config.json, model-0000i.safetensors),
// all at one commit whose id is the SHA-1 of their contents. With --token, requests must
// carry `Authorization: Bearer TOKEN` (a gated model); without, anyone may read.
//
//	GET      /api/models/ORG/NAME[/revision/REV]     repo info: id, sha, siblings
//	GET      /api/models/ORG/NAME/tree/REV[/PATH]    the files (recursive), one page
//	HEAD|GET /ORG/NAME/resolve/REV/PATH              a file: X-Repo-Commit, ETag, size
//
// REV is `main` or the commit id. Errors carry the Hub's X-Error-Code header
// (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo), which the client reads.
// Every request is logged on stderr.
package main

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"sort"
	"strings"
)

type file struct {
	path string
	data []byte
}

type repo struct {
	id     string
	commit string
	files  map[string]file
	token  string
}

// buildRepo makes the repository's files: two small JSON files and `weights` blobs of
// 64 KiB whose bytes depend only on their index.
func buildRepo(id string, weights int, token string) *repo {
	files := []file{
		{"config.json", []byte(`{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}` + "\n")},
		{"tokenizer_config.json", []byte(`{"model_max_length": 4096}` + "\n")},
	}
	for i := 1; i <= weights; i++ {
		data := make([]byte, 64<<10)
		for j := range data {
			data[j] = byte((i*131 + j*7) % 251)
		}
		files = append(files, file{fmt.Sprintf("model-%05d-of-%05d.safetensors", i, weights), data})
	}
	h := sha1.New()
	r := &repo{id: id, files: map[string]file{}, token: token}
	for _, f := range files {
		h.Write([]byte(f.path))
		h.Write(f.data)
		r.files[f.path] = f
	}
	r.commit = hex.EncodeToString(h.Sum(nil))
	return r
}

func (r *repo) sortedPaths() []string {
	paths := make([]string, 0, len(r.files))
	for p := range r.files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	return paths
}

func fail(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("X-Error-Code", code)
	w.Header().Set("X-Error-Message", message)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": message})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func (r *repo) revisionOK(rev string) bool {
	return rev == "main" || rev == r.commit
}

func (r *repo) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	log.Printf("%s %s", req.Method, req.URL.RequestURI())
	if r.token != "" && req.Header.Get("Authorization") != "Bearer "+r.token {
		fail(w, http.StatusUnauthorized, "GatedRepo", "Access to model "+r.id+" is restricted: pass a token.")
		return
	}
	path := req.URL.Path
	switch {
	case strings.HasPrefix(path, "/api/models/"+r.id):
		r.api(w, strings.TrimPrefix(path, "/api/models/"+r.id))
	case strings.HasPrefix(path, "/"+r.id+"/resolve/"):
		r.resolve(w, req, strings.TrimPrefix(path, "/"+r.id+"/resolve/"))
	case strings.HasPrefix(path, "/api/models/") || strings.Contains(path, "/resolve/"):
		fail(w, http.StatusNotFound, "RepoNotFound", "Repository not found")
	default:
		fail(w, http.StatusNotFound, "EntryNotFound", "not a Hub API path: "+path)
	}
}

// api answers repo info (`""`, `/revision/REV`) and the tree (`/tree/REV[/PATH]`).
func (r *repo) api(w http.ResponseWriter, rest string) {
	rev := "main"
	switch {
	case rest == "":
	case strings.HasPrefix(rest, "/revision/"):
		rev = strings.TrimPrefix(rest, "/revision/")
	case strings.HasPrefix(rest, "/tree/"):
		parts := strings.SplitN(strings.TrimPrefix(rest, "/tree/"), "/", 2)
		if !r.revisionOK(parts[0]) {
			fail(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+parts[0])
			return
		}
		prefix := ""
		if len(parts) == 2 {
			prefix = parts[1] + "/"
		}
		entries := []map[string]any{}
		for _, p := range r.sortedPaths() {
			if !strings.HasPrefix(p, prefix) {
				continue
			}
			f := r.files[p]
			entries = append(entries, map[string]any{
				"type": "file", "path": p, "size": len(f.data), "oid": gitBlobID(f.data),
			})
		}
		writeJSON(w, entries)
		return
	default:
		fail(w, http.StatusNotFound, "EntryNotFound", "unknown API path")
		return
	}
	if !r.revisionOK(rev) {
		fail(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
		return
	}
	siblings := []map[string]any{}
	for _, p := range r.sortedPaths() {
		siblings = append(siblings, map[string]any{"rfilename": p})
	}
	writeJSON(w, map[string]any{
		"id": r.id, "modelId": r.id, "sha": r.commit, "private": r.token != "",
		"gated": false, "disabled": false, "siblings": siblings,
	})
}

// resolve serves `REV/PATH` with the headers the client's file metadata reads.
func (r *repo) resolve(w http.ResponseWriter, req *http.Request, rest string) {
	parts := strings.SplitN(rest, "/", 2)
	if len(parts) != 2 || !r.revisionOK(parts[0]) {
		fail(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id")
		return
	}
	f, ok := r.files[parts[1]]
	if !ok {
		fail(w, http.StatusNotFound, "EntryNotFound", parts[1]+" does not exist on "+parts[0])
		return
	}
	sum := sha256.Sum256(f.data)
	w.Header().Set("X-Repo-Commit", r.commit)
	w.Header().Set("ETag", `"`+hex.EncodeToString(sum[:])+`"`)
	w.Header().Set("Content-Length", fmt.Sprint(len(f.data)))
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Accept-Ranges", "bytes")
	if req.Method == http.MethodHead {
		return
	}
	http.ServeContent(w, req, f.path, timeZero, strings.NewReader(string(f.data)))
}

// gitBlobID is the id git gives the content (`blob <size>\0<data>`), as the Hub's `oid`.
func gitBlobID(data []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(data))
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

func main() {
	listen := flag.String("listen", ":8080", "address to serve on")
	id := flag.String("repo", "infera-test/tiny-model", "the repository id (ORG/NAME)")
	weights := flag.Int("files", 3, "weight files of 64 KiB in the repository")
	token := flag.String("token", "", "require this bearer token (a gated model)")
	flag.Parse()
	r := buildRepo(*id, *weights, *token)
	log.Printf("serving %s at commit %s (%d files) on %s", r.id, r.commit, len(r.files), *listen)
	if err := http.ListenAndServe(*listen, r); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}
