// Command modproxy writes the repository's modules, at a candidate version,
// as a file-based module proxy (GOPROXY=file://DIR), the way a module proxy
// would serve them once the version is tagged: scripts/release-check.sh
// installs and builds against it offline, as a new user would.
//
//	go run ./internal/modproxy -version v0.1.0 -out DIR [-write-sums]
//
// It refuses what a proxy could not serve or a user could not build: a
// replace directive in a published go.mod, a requirement on one of the
// repository's modules at another version than the candidate, or on a
// module of the repository that is not published (a test helper under
// internal/). It publishes the modules go.work lists, minus those under
// internal/.
//
// The modules require each other at the candidate, which no checksum
// database knows before the tag: each module's go.sum gets the h1: lines of
// the siblings it needs, computed from the zips made here in dependency
// order (a zip holds its own go.sum, so a dependent's sums come after its
// dependencies' zips). -write-sums writes those go.sum files back into the
// working tree: the release commit (RELEASING.md) carries them, so that
// every tagged go.sum is complete.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"
)

// prefix is the module path every module of the repository starts with.
const prefix = "github.com/leasehold/leasehold"

type mod struct {
	dir  string // relative to the root, "." for the root module
	path string
	file *modfile.File
	sums []byte // go.sum, with the siblings' lines added
	deps []string
	zip  string // h1: of the zip
	gmod string // h1: of the go.mod
}

func main() {
	version := flag.String("version", "", "candidate version, e.g. v0.1.0")
	out := flag.String("out", "", "proxy directory to write (GOPROXY=file://DIR)")
	root := flag.String("root", ".", "repository root (holds go.work)")
	writeSums := flag.Bool("write-sums", false, "write each module's go.sum, with the siblings' checksums, into the working tree")
	flag.Parse()
	if err := run(*root, *version, *out, *writeSums); err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
}

func run(root, version, out string, writeSums bool) error {
	if !semver.IsValid(version) || semver.Canonical(version) != version || semver.Build(version) != "" {
		return fmt.Errorf("-version %q: want a canonical semantic version such as v0.1.0", version)
	}
	if out == "" && !writeSums {
		return errors.New("-out DIR or -write-sums is needed")
	}
	mods, err := load(root, version)
	if err != nil {
		return err
	}
	files, err := gitFiles(root)
	if err != nil {
		return err
	}
	byPath := map[string]*mod{}
	for _, m := range mods {
		byPath[m.path] = m
	}
	for _, m := range order(mods, byPath) {
		if err := m.addSums(root, version, byPath); err != nil {
			return err
		}
		var zipBuf bytes.Buffer
		if err := m.zipTo(&zipBuf, root, version, files, mods); err != nil {
			return err
		}
		if m.zip, err = hashZip(zipBuf.Bytes()); err != nil {
			return err
		}
		gomod, err := os.ReadFile(filepath.Join(root, m.dir, "go.mod"))
		if err != nil {
			return err
		}
		if m.gmod, err = dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(gomod)), nil
		}); err != nil {
			return err
		}
		if out != "" {
			if err := publish(out, m.path, version, gomod, zipBuf.Bytes()); err != nil {
				return err
			}
		}
		if writeSums {
			if err := os.WriteFile(filepath.Join(root, m.dir, "go.sum"), m.sums, 0o644); err != nil {
				return err
			}
		}
		fmt.Printf("%s@%s %s\n", m.path, version, m.zip)
	}
	return nil
}

// load reads the modules go.work uses and checks their go.mod files.
func load(root, version string) ([]*mod, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, err
	}
	work, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	var mods []*mod
	published := map[string]bool{}
	for _, u := range work.Use {
		dir := path.Clean(filepath.ToSlash(u.Path))
		if dir == "internal" || strings.HasPrefix(dir, "internal/") {
			continue // tools and test helpers: never fetched by a user
		}
		data, err := os.ReadFile(filepath.Join(root, dir, "go.mod"))
		if err != nil {
			return nil, err
		}
		f, err := modfile.Parse(dir+"/go.mod", data, nil)
		if err != nil {
			return nil, err
		}
		mods = append(mods, &mod{dir: dir, path: f.Module.Mod.Path, file: f})
		published[f.Module.Mod.Path] = true
	}
	var problems []string
	for _, m := range mods {
		want := prefix
		if m.dir != "." {
			want += "/" + m.dir
		}
		if m.path != want {
			problems = append(problems, fmt.Sprintf("%s/go.mod: module %s, want %s (a proxy serves a sub-module from its directory)", m.dir, m.path, want))
		}
		for _, r := range m.file.Replace {
			problems = append(problems, fmt.Sprintf("%s/go.mod: replace %s: a user's go command refuses or ignores it; development goes through go.work", m.dir, r.Old.Path))
		}
		for _, r := range m.file.Require {
			p := r.Mod.Path
			if p != prefix && !strings.HasPrefix(p, prefix+"/") {
				continue
			}
			switch {
			case !published[p]:
				problems = append(problems, fmt.Sprintf("%s/go.mod: requires %s, which is not published (a test helper?): a user's go mod tidy cannot fetch it", m.dir, p))
			case r.Mod.Version != version:
				problems = append(problems, fmt.Sprintf("%s/go.mod: requires %s %s, want the candidate %s", m.dir, p, r.Mod.Version, version))
			default:
				m.deps = append(m.deps, p)
			}
		}
	}
	if len(problems) > 0 {
		return nil, errors.New("modules a proxy could not serve:\n  " + strings.Join(problems, "\n  "))
	}
	return mods, nil
}

// order returns the modules with every module after the siblings it
// requires.
func order(mods []*mod, byPath map[string]*mod) []*mod {
	var out []*mod
	done := map[string]bool{}
	var visit func(m *mod)
	visit = func(m *mod) {
		if done[m.path] {
			return
		}
		done[m.path] = true
		for _, d := range m.deps {
			visit(byPath[d])
		}
		out = append(out, m)
	}
	for _, m := range mods {
		visit(m)
	}
	return out
}

// closure returns the siblings m needs, directly or through other siblings.
func (m *mod) closure(byPath map[string]*mod) []*mod {
	seen := map[string]bool{}
	var out []*mod
	var visit func(p string)
	visit = func(p string) {
		if seen[p] {
			return
		}
		seen[p] = true
		d := byPath[p]
		out = append(out, d)
		for _, dd := range d.deps {
			visit(dd)
		}
	}
	for _, d := range m.deps {
		visit(d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out
}

// addSums sets m.sums: the module's go.sum without lines for any sibling,
// plus the checksums of every sibling it needs at the candidate.
func (m *mod) addSums(root, version string, byPath map[string]*mod) error {
	data, err := os.ReadFile(filepath.Join(root, m.dir, "go.sum"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		if l == "" || strings.HasPrefix(l, prefix+" ") || strings.HasPrefix(l, prefix+"/") {
			continue
		}
		lines = append(lines, l)
	}
	for _, d := range m.closure(byPath) {
		lines = append(lines,
			fmt.Sprintf("%s %s %s", d.path, version, d.zip),
			fmt.Sprintf("%s %s/go.mod %s", d.path, version, d.gmod))
	}
	// go.sum order is by path: place the new lines, keep the rest as go
	// wrote them.
	sort.SliceStable(lines, func(i, j int) bool {
		return strings.Fields(lines[i])[0] < strings.Fields(lines[j])[0]
	})
	if len(lines) > 0 {
		m.sums = []byte(strings.Join(lines, "\n") + "\n")
	}
	return nil
}

// gitFiles lists the files of the working tree that a tag would hold:
// tracked, and untracked but not ignored (so a new file counts before its
// commit).
func gitFiles(root string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %w", err)
	}
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f == "" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(root, f)); err != nil {
			continue // deleted, not yet committed
		}
		files = append(files, f)
	}
	return files, nil
}

type file struct {
	name string // in the zip, relative to the module
	disk string
	data []byte // replaces the file on disk when not nil
}

func (f file) Path() string { return f.name }
func (f file) Lstat() (os.FileInfo, error) {
	fi, err := os.Lstat(f.disk)
	if err != nil || f.data == nil {
		return fi, err
	}
	return sizedInfo{fi, int64(len(f.data))}, nil
}
func (f file) Open() (io.ReadCloser, error) {
	if f.data != nil {
		return io.NopCloser(bytes.NewReader(f.data)), nil
	}
	return os.Open(f.disk)
}

type sizedInfo struct {
	os.FileInfo
	size int64
}

func (s sizedInfo) Size() int64 { return s.size }

// zipTo writes m's module zip: its files, less those of nested modules,
// with m.sums as go.sum.
func (m *mod) zipTo(w io.Writer, root, version string, files []string, mods []*mod) error {
	// Nested modules: every directory below m's with a go.mod file (also
	// modules go.work does not list, such as internal/modproxy).
	var nested []string
	for _, f := range files {
		if path.Base(f) == "go.mod" && path.Dir(f) != m.dir {
			nested = append(nested, path.Dir(f)+"/")
		}
	}
	var zf []modzip.File
	haveSum := false
	for _, f := range files {
		rel := f
		if m.dir != "." {
			if !strings.HasPrefix(f, m.dir+"/") {
				continue
			}
			rel = strings.TrimPrefix(f, m.dir+"/")
		}
		inNested := false
		for _, n := range nested {
			if strings.HasPrefix(f, n) && (m.dir == "." || strings.HasPrefix(n, m.dir+"/")) {
				inNested = true
			}
		}
		if inNested {
			continue
		}
		e := file{name: rel, disk: filepath.Join(root, f)}
		if rel == "go.sum" {
			e.data, haveSum = m.sums, true
			if e.data == nil {
				continue
			}
		}
		zf = append(zf, e)
	}
	if !haveSum && m.sums != nil {
		zf = append(zf, file{name: "go.sum", disk: filepath.Join(root, m.dir, "go.mod"), data: m.sums})
	}
	return modzip.Create(w, module.Version{Path: m.path, Version: version}, zf)
}

func hashZip(data []byte) (string, error) {
	tmp, err := os.CreateTemp("", "modproxy-*.zip")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return dirhash.HashZip(tmp.Name(), dirhash.Hash1)
}

// publish writes the proxy files of path@version under out.
func publish(out, modPath, version string, gomod, zip []byte) error {
	esc, err := module.EscapePath(modPath)
	if err != nil {
		return err
	}
	dir := filepath.Join(out, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": info,
		version + ".mod":  gomod,
		version + ".zip":  zip,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
