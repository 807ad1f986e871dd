package viewer_test

import (
	"context"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/polyloop/polyloop/engine"
	"github.com/polyloop/polyloop/report"
	"github.com/polyloop/polyloop/seams/seamstest"
	"github.com/polyloop/polyloop/viewer"
)

// forked: a source that reads, pays (a never action, at step 1) and
// answers; a fork of it at step 1 that answers at once under a larger
// budget; and a fork, at step 1, of a source whose id needs escaping.
func forked(t *testing.T) *httptest.Server {
	store := &seamstest.MemStore{}
	runOn(t, store, "source", -1, `TOOL read {}`, `TOOL pay {}`, `FINAL: paid`)
	runOn(t, store, "odd <&> source", -1, `TOOL read {}`, `FINAL: read`)
	for _, f := range []struct{ id, from string }{{"fork", "source"}, {"odd-fork", "odd <&> source"}} {
		req := request(f.id)
		req.Budget.MaxSteps = 9
		def := engine.Definition{Model: &seamstest.Model{Turns: seamstest.Replies("-", `FINAL: no need`)}, Parser: seamstest.Parser{}, Store: store}
		if _, err := engine.Fork(context.Background(), def, req, f.from, 1); err != nil {
			t.Fatalf("fork %s: %v", f.id, err)
		}
	}
	// A fork of a fork of a fork: its steps 0 and 1 first ran in two runs.
	for _, f := range []struct{ id, from string }{{"grand", "fork"}, {"great", "grand"}} {
		def := engine.Definition{Model: &seamstest.Model{Turns: seamstest.Replies("-", "-", `FINAL: again`)}, Parser: seamstest.Parser{}, Store: store}
		req := request(f.id)
		req.Budget.MaxSteps = 9
		if _, err := engine.Fork(context.Background(), def, req, f.from, 2); err != nil {
			t.Fatalf("fork %s: %v", f.id, err)
		}
	}
	srv := httptest.NewServer(viewer.New(store, viewer.Options{}))
	t.Cleanup(srv.Close)
	return srv
}

// TestTheRunPageShowsLineage: a fork's page says where it came from (a
// link to the source's page), at which step, what is copied, how its
// parameters differ and the never actions the source executed that it
// does not see; the source's page links its forks; ids are escaped in
// text and in links alike.
func TestTheRunPageShowsLineage(t *testing.T) {
	srv := forked(t)
	for _, c := range []struct {
		id   string
		want []string
	}{
		{"fork", []string{`forked from <a href="run?id=source">source</a> at step <b>1</b>: step 0 is copied from source`,
			`<li>differs: budget.max_steps: &#34;5&#34; at start, now &#34;9&#34;</li>`,
			`<p class="bad" id="unseen">the source executed 1 never action at step 1 and after (not seen by this fork): they happened in the world</p>`}},
		{"source", []string{`<p id="forks">forks: <a href="run?id=fork">fork</a> at step 1</p>`}},
		{"great", []string{`forked from <a href="run?id=grand">grand</a> at step <b>2</b>: steps 0–1 are copied from grand; ` +
			`step 0 first ran in <a href="run?id=source">source</a>; step 1 ran in <a href="run?id=fork">fork</a></p>`}},
		{"odd-fork", []string{`forked from <a href="run?id=odd%20%3c%26%3e%20source">odd &lt;&amp;&gt; source</a> at step <b>1</b>`}},
		{"odd <&> source", []string{`forks: <a href="run?id=odd-fork">odd-fork</a> at step 1`}},
	} {
		code, _, body := get(t, srv.URL+"/run?"+url.Values{"id": {c.id}}.Encode())
		if code != 200 {
			t.Fatalf("%s: %d %s", c.id, code, body)
		}
		for _, w := range c.want {
			if !strings.Contains(body, w) {
				t.Errorf("%s's page lacks %s:\n%s", c.id, w, body)
			}
		}
	}
	if _, _, body := get(t, srv.URL+"/"); !strings.Contains(body, `<small class="forked-from">forked from <a href="run?id=source">source</a> at step 1</small>`) {
		t.Errorf("the runs page does not say where fork came from:\n%s", body)
	}
}

// TestTheJSONEndpointsCarryLineage: /api/runs and /api/verify carry the
// lineage the inspector prints with --json.
func TestTheJSONEndpointsCarryLineage(t *testing.T) {
	srv := forked(t)
	var runs []report.RunJSON
	decode(t, srv.URL+"/api/runs", &runs)
	byID := map[string]report.Lineage{}
	for _, r := range runs {
		byID[r.RunID] = r.Lineage
	}
	var v report.VerdictJSON
	decode(t, srv.URL+"/api/verify?run=fork", &v)
	for _, l := range []report.Lineage{byID["fork"], v.Lineage} {
		if o := l.ForkedFrom; o == nil || o.Run != "source" || o.Step != 1 || len(o.Differences) != 1 ||
			l.SourceNeverActions == nil || *l.SourceNeverActions != 1 {
			t.Errorf("fork's lineage %+v", l)
		}
	}
	decode(t, srv.URL+"/api/verify?run=source", &v)
	if want := []report.Fork{{Run: "fork", Step: 1}}; !reflect.DeepEqual(v.Forks, want) || !reflect.DeepEqual(byID["source"].Forks, want) ||
		v.ForkedFrom != nil {
		t.Errorf("source's lineage: verify %+v, runs %+v", v.Lineage, byID["source"])
	}
}
