// Command stalecomments fails when a comment in the repository's Go code
// names an identifier or a file that does not exist: a comment describing
// code that was renamed, moved or removed.
//
// Usage, from the repository root:
//
//	go run ./tools/stalecomments [dir]
//
// It reads every .go file under dir (the current directory by default),
// skipping nested modules' vendor and testdata directories, and checks in
// each comment:
//
//   - a word shaped like a Go identifier that no person writes in prose
//     (mixedCase such as leaseMargin, or CamelCase with an inner capital
//     such as HoldLease) must be an identifier written somewhere in the
//     repository's Go code, declared or used;
//   - pkg.Name, where pkg is one of the repository's packages, must be a
//     name declared in that package (Type.Method included);
//   - a word ending in .go, .sql, .md, .sh, .js, .html or .css must name a
//     file of the repository: relative to the comment's directory or the
//     root, or, for a bare name, any file of that name.
//
// Words inside URLs are not checked. A name the check cannot know (a
// product, another library's API never called here) goes in allow.txt
// beside this file, one a line. It prints each finding as
// file:line: message and exits 1 when there is any.
package main

import (
	_ "embed"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

//go:embed allow.txt
var allowText string

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	findings, err := check(root, allowed(allowText))
	if err != nil {
		fmt.Fprintln(os.Stderr, "stalecomments:", err)
		os.Exit(2)
	}
	for _, f := range findings {
		fmt.Println(f)
	}
	if len(findings) > 0 {
		fmt.Fprintf(os.Stderr, "stalecomments: %d comments name what does not exist: fix the comment (or, for a name the check cannot know, add it to tools/stalecomments/allow.txt)\n", len(findings))
		os.Exit(1)
	}
}

// allowed reads allow.txt: one name a line, # starts a comment.
func allowed(text string) map[string]bool {
	m := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		line, _, _ = strings.Cut(line, "#")
		if line = strings.TrimSpace(line); line != "" {
			m[line] = true
		}
	}
	return m
}

// pkgInfo is what one directory's package declares.
type pkgInfo struct {
	name  string
	decls map[string]bool // top-level names, and Type.Method / Type.Field
}

type repo struct {
	root   string
	files  map[string]bool // every file, slash path relative to root
	bases  map[string]bool // every file's base name
	idents map[string]bool // every identifier written in Go code
	pkgs   map[string]*pkgInfo
	allow  map[string]bool
}

var (
	urlRE      = regexp.MustCompile(`[a-z][a-z0-9+.-]*://\S+`)
	wordRE     = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*(?:\.(?:go|sql|md|sh|js|html|css))?`)
	fileRE     = regexp.MustCompile(`^[A-Za-z0-9_./-]+\.(go|sql|md|sh|js|html|css)$`)
	pathWordRE = regexp.MustCompile(`[A-Za-z0-9_./*-]+\.(?:go|sql|md|sh|js|html|css)\b`)
	mixedRE    = regexp.MustCompile(`^[a-z][a-z0-9]*[A-Z][A-Za-z0-9]*$`)
	camelRE    = regexp.MustCompile(`^[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*$`)
	// codeLine is an indented line of a doc comment: a code block.
	codeLine = regexp.MustCompile(`^//(\t|   )`)
)

func check(root string, allow map[string]bool) ([]string, error) {
	r := &repo{root: root, files: map[string]bool{}, bases: map[string]bool{}, idents: map[string]bool{}, pkgs: map[string]*pkgInfo{}, allow: allow}
	type parsed struct {
		path string
		file *ast.File
	}
	var goFiles []parsed
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "vendor" || name == "node_modules" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		r.files[filepath.ToSlash(rel)] = true
		r.bases[name] = true
		if strings.HasSuffix(name, ".go") {
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
			if err != nil {
				return fmt.Errorf("parse %s: %w", path, err)
			}
			goFiles = append(goFiles, parsed{path, f})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, p := range goFiles {
		r.collect(p.path, p.file)
	}
	var findings []string
	for _, p := range goFiles {
		for _, cg := range p.file.Comments {
			for _, c := range cg.List {
				if strings.HasPrefix(c.Text, "//go:") || strings.HasPrefix(c.Text, "//nolint") {
					continue
				}
				pos := fset.Position(c.Pos())
				for i, line := range strings.Split(c.Text, "\n") {
					if codeLine.MatchString(line) {
						continue // an example in a doc comment declares its own names
					}
					for _, msg := range r.checkLine(filepath.Dir(p.path), line) {
						findings = append(findings, fmt.Sprintf("%s:%d: %s", pos.Filename, pos.Line+i, msg))
					}
				}
			}
		}
	}
	sort.Strings(findings)
	return findings, nil
}

// collect records the identifiers of f and what its package declares.
func (r *repo) collect(path string, f *ast.File) {
	dir := filepath.Dir(path)
	key := dir + "\x00" + f.Name.Name
	p := r.pkgs[key]
	if p == nil {
		p = &pkgInfo{name: f.Name.Name, decls: map[string]bool{}}
		r.pkgs[key] = p
	}
	ast.Inspect(f, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok {
			r.idents[id.Name] = true
		}
		return true
	})
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				p.decls[d.Name.Name] = true
				continue
			}
			if t := recvType(d.Recv.List[0].Type); t != "" {
				p.decls[t+"."+d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					p.decls[s.Name.Name] = true
					if st, ok := s.Type.(*ast.StructType); ok {
						for _, fl := range st.Fields.List {
							for _, n := range fl.Names {
								p.decls[s.Name.Name+"."+n.Name] = true
							}
						}
					}
					if it, ok := s.Type.(*ast.InterfaceType); ok {
						for _, m := range it.Methods.List {
							for _, n := range m.Names {
								p.decls[s.Name.Name+"."+n.Name] = true
							}
						}
					}
				case *ast.ValueSpec:
					for _, n := range s.Names {
						p.decls[n.Name] = true
					}
				}
			}
		}
	}
}

func recvType(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvType(t.X)
	case *ast.IndexExpr:
		return recvType(t.X)
	case *ast.IndexListExpr:
		return recvType(t.X)
	case *ast.Ident:
		return t.Name
	}
	return ""
}

// ourPackage reports the declarations of the repository's packages named
// name (several directories may hold a package of one name), or nil.
func (r *repo) ourPackage(name string) []*pkgInfo {
	var ps []*pkgInfo
	for _, p := range r.pkgs {
		if p.name == name && name != "main" {
			ps = append(ps, p)
		}
	}
	return ps
}

func (r *repo) checkLine(dir, line string) []string {
	line = urlRE.ReplaceAllString(line, " ")
	var out []string
	for _, w := range pathWordRE.FindAllString(line, -1) {
		if msg := r.checkFile(dir, w); msg != "" {
			out = append(out, msg)
		}
	}
	line = pathWordRE.ReplaceAllString(line, " ")
	for _, w := range wordRE.FindAllString(line, -1) {
		w = strings.TrimRight(w, ".")
		if r.allow[w] {
			continue
		}
		if pkg, name, ok := strings.Cut(w, "."); ok {
			ps := r.ourPackage(pkg)
			if len(ps) == 0 {
				continue // another library's name, or prose ("e.g.")
			}
			found := false
			for _, p := range ps {
				if p.decls[name] {
					found = true
				}
			}
			if !found && !r.allow[w] && looksLikeName(name) {
				out = append(out, fmt.Sprintf("%s: package %s declares no %s", w, pkg, name))
			}
			continue
		}
		if (mixedRE.MatchString(w) || camelRE.MatchString(w)) && !r.known(w) && !r.known(strings.TrimSuffix(w, "s")) {
			out = append(out, fmt.Sprintf("%s: no such identifier in the repository's Go code", w))
		}
	}
	return out
}

// known reports whether w is written in the code or allowed, or names a
// test or benchmark without its prefix (go test -run X). A plural ("Clients")
// is tried without its s by the caller.
func (r *repo) known(w string) bool {
	return r.idents[w] || r.allow[w] || r.idents["Test"+w] || r.idents["Benchmark"+w]
}

// looksLikeName reports whether the part after "pkg." is a Go name rather
// than the start of a sentence.
func looksLikeName(s string) bool {
	if s == "" {
		return false
	}
	first, _, _ := strings.Cut(s, ".")
	return first[0] >= 'A' && first[0] <= 'Z' || mixedRE.MatchString(first)
}

func (r *repo) checkFile(dir, w string) string {
	if strings.HasPrefix(w, ".") && !strings.HasPrefix(w, "./") && !strings.HasPrefix(w, "../") {
		return "" // an extension (".tx.up.sql"), not a file
	}
	w = strings.TrimPrefix(strings.TrimPrefix(w, "./"), "../")
	w = strings.TrimRight(w, ".")
	if !fileRE.MatchString(w) || strings.Contains(w, "*") {
		return ""
	}
	if r.allow[w] {
		return ""
	}
	relDir, _ := filepath.Rel(r.root, dir)
	if r.files[w] || r.files[filepath.ToSlash(filepath.Join(relDir, w))] {
		return ""
	}
	if !strings.Contains(w, "/") && r.bases[w] {
		return ""
	}
	// A path relative to a directory above the comment's (a path from a
	// package's parent).
	for d := relDir; d != "." && d != "/" && d != ""; d = filepath.Dir(d) {
		if r.files[filepath.ToSlash(filepath.Join(d, w))] {
			return ""
		}
	}
	return fmt.Sprintf("%s: no such file in the repository", w)
}
