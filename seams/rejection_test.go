package seams

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// rejection validates args against schema, both JSON, and returns the
// library's error.
func rejection(t *testing.T, schema, args string) *jsonschema.ValidationError {
	t.Helper()
	var params map[string]any
	if err := json.Unmarshal([]byte(schema), &params); err != nil {
		t.Fatal(err)
	}
	compiled, err := compileSchema("t", params)
	if err != nil {
		t.Fatal(err)
	}
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(args))
	if err != nil {
		t.Fatal(err)
	}
	ve, ok := errors.AsType[*jsonschema.ValidationError](compiled.Validate(v))
	if !ok {
		t.Fatalf("%s against %s: no validation error", args, schema)
	}
	return ve
}

// TestASmallRejectionReadsAsTheLibraryWordsIt: the bounded rejection text
// is the library's own for every kind of failure when nothing in it is
// long.
func TestASmallRejectionReadsAsTheLibraryWordsIt(t *testing.T) {
	for _, c := range []struct{ schema, args string }{
		{`{"type":"object","properties":{"q":{"type":"string","pattern":"^a+$"}}}`, `{"q":"b'\"c\n"}`},
		{`{"type":"object","properties":{"q":{"type":"string"}}}`, `{"q":3}`},
		{`{"type":"object","required":["q","r"]}`, `{}`},
		{`{"type":"object","additionalProperties":false}`, `{"x~/y":1,"z":2}`},
		{`{"type":"object","propertyNames":{"maxLength":2}}`, `{"long":1}`},
		{`{"type":"object","properties":{"q":{"anyOf":[{"pattern":"^a$"},{"pattern":"^b$"},{"type":"number"}]}}}`, `{"q":"c"}`},
		{`{"type":"object","properties":{"q":{"oneOf":[{"type":"string"},{"minLength":1}]}}}`, `{"q":"cc"}`},
		{`{"type":"object","properties":{"q":{"enum":["a","b"]},"r":{"const":4}}}`, `{"q":"c","r":5}`},
		{`{"type":"object","properties":{"l":{"type":"array","items":{"type":"string"},"maxItems":1}}}`, `{"l":[1,"x",2]}`},
		{`{"type":"object","dependentRequired":{"a":["b"]}}`, `{"a":1}`},
		{`{"$defs":{"s":{"type":"string"}},"type":"object","properties":{"q":{"$ref":"#/$defs/s"}}}`, `{"q":1}`},
		{`{"type":"object","properties":{"q":{"allOf":[{"$ref":"#/$defs/s"},{"maxLength":1}]}},"$defs":{"s":{"pattern":"^x"}}}`, `{"q":"yy"}`},
		{`{"type":"object","properties":{"q":{"not":{"type":"string"}}}}`, `{"q":"s"}`},
		{`{"type":"object","properties":{"l":{"contains":{"type":"number"},"maxContains":1}}}`, `{"l":[1,"x",2,3]}`},
		{`{"type":"object","properties":{"l":{"contains":{"type":"number"},"minContains":3}}}`, `{"l":[1,"x",2]}`},
		{`{"$defs":{"n":{"type":"object","additionalProperties":{"$ref":"#/$defs/n"}}},"$ref":"#/$defs/n"}`, deep(16, "k")},
	} {
		ve := rejection(t, c.schema, c.args)
		if got, want := rejectionText(ve), ve.Error(); got != want {
			t.Errorf("%s against %s:\n got %q\nwant %q", c.args, c.schema, got, want)
		}
	}
}

// deep is a JSON object nested depth times under key, a number at the
// bottom.
func deep(depth int, key string) string {
	return strings.Repeat(`{"`+key+`":`, depth) + "1" + strings.Repeat("}", depth)
}

// TestALargeRejectionIsBounded: what a rejection quotes from the arguments
// — a value once per failing branch, property names, the location of a
// deeply nested value, failing and matching items — is cut, each cut
// saying what it left out, so a rejection of megabytes of arguments stays
// small however the schema branches.
func TestALargeRejectionIsBounded(t *testing.T) {
	big := strings.Repeat("\u0085", 1<<20) // 2 MiB, each rune quoted as 6 bytes
	many := func(n int) string {
		var sb strings.Builder
		sb.WriteString("{")
		for i := range n {
			if i > 0 {
				sb.WriteString(",")
			}
			sb.WriteString(`"` + strings.Repeat("p", 1000) + string(rune('a'+i%26)) + strings.Repeat("k", i) + `":1`)
		}
		return sb.String() + "}"
	}
	items, _ := json.Marshal(map[string]any{"l": make([]int, 5000)})
	matching, _ := json.Marshal(map[string]any{"l": make([]int, 200000)})
	for _, c := range []struct {
		name, schema, args string
		says               []string
	}{
		{"a value per schema branch",
			`{"type":"object","properties":{"q":{"anyOf":[{"pattern":"^a*$"},{"pattern":"^b*$"},{"pattern":"^c*$"}]}}}`,
			`{"q":"` + big + `"}`, []string{"'^a*$'", "'^b*$'", "'^c*$'", "(2097152 bytes)"}},
		{"a long property name in the location",
			`{"type":"object","additionalProperties":{"type":"string"}}`,
			`{"` + strings.Repeat("n", 1<<20) + `":1}`, []string{"(1048576 bytes)", "want string"}},
		{"many additional properties", `{"type":"object","additionalProperties":false}`, many(300),
			[]string{"… 284 more"}},
		{"many failing items", `{"type":"object","properties":{"l":{"type":"array","items":{"type":"string"}}}}`, string(items),
			[]string{"at '/l/0': got number, want string", "more"}},
		{"many matching items", `{"type":"object","properties":{"l":{"contains":{"type":"number"},"maxContains":1}}}`, string(matching),
			[]string{"matched 200,000 items at 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 …"}},
		{"a deep location", `{"$defs":{"n":{"type":"object","additionalProperties":{"$ref":"#/$defs/n"}}},"$ref":"#/$defs/n"}`,
			deep(2000, strings.Repeat("k", 256)), []string{"/… 1984 more/", "got number, want object"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ve := rejection(t, c.schema, c.args)
			got := rejectionText(ve)
			if len(got) > 32<<10 {
				t.Errorf("a rejection of %d bytes of arguments is %d bytes long", len(c.args), len(got))
			}
			for _, s := range c.says {
				if !strings.Contains(got, s) {
					t.Errorf("the rejection does not say %q:\n%.2000s", s, got)
				}
			}
		})
	}
}
