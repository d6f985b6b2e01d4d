package docs

// The cloud config's fields and defaults in reference.md, against
// provider.Config by reflection.

import (
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/labcloud/labcloud/netroutes"
	"github.com/labcloud/labcloud/provider"
)

func TestCloudConfigDocumented(t *testing.T) {
	var fields []cfgField
	configFields(reflect.TypeFor[provider.Config](), "", &fields)
	known := map[string]cfgField{}
	for _, f := range fields {
		known[f.path] = f
	}

	// What a config that turns routes and load balancers on ends up with
	// (defaults filled in by LoadConfig), and the defaults netroutes
	// applies to the zero values it is handed.
	completed, err := provider.LoadConfig(strings.NewReader(`
routes: {bridge: br0}
loadBalancer: {bridge: br0, pools: [{name: p, addresses: [192.0.2.1]}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	// What that document sets itself is not a default.
	setByTest := []string{"routes.bridge", "loadBalancer.bridge", "loadBalancer.pools"}
	// Defaults taken from this machine or from other fields: their rows
	// say so in words.
	fromElsewhere := map[string]bool{"host": true, "hypervisors[].host": true, "hypervisors[].bridge": true}
	defaults := reflect.ValueOf(provider.DefaultConfig())
	derived := map[string]any{
		"routes.protocol": int(netroutes.DefaultProtocol),
		"routes.metric":   netroutes.DefaultMetric,
	}

	ref := readDoc(t, reference)
	sec := section(t, ref, "Cloud config")
	rows := map[string][]string{}
	for _, tb := range tables(sec) {
		if len(tb.header) < 3 || tb.header[0] != "field" || tb.header[1] != "default" {
			continue
		}
		for _, row := range tb.rows {
			path := firstSpan(row[0])
			if _, ok := known[path]; !ok {
				t.Errorf("%s documents cloud-config field %q, which provider.Config does not have", reference, path)
				continue
			}
			rows[path] = row
		}
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no cloud-config table (field | default | ...)", reference)
	}
	for _, f := range fields {
		row, ok := rows[f.path]
		if !ok {
			if !f.group {
				t.Errorf("%s: cloud-config field %s has no row", reference, f.path)
			}
			continue
		}
		if fromElsewhere[f.path] {
			if strings.TrimSpace(row[1]) == "" {
				t.Errorf("%s: %s's row does not say where its default comes from", reference, f.path)
			}
			continue
		}
		// The default: DefaultConfig's; else what LoadConfig derives; else
		// what netroutes makes of a zero.
		want, ok := valueAt(defaults, f.path)
		if !ok || isEmpty(want) {
			if !slices.ContainsFunc(setByTest, func(p string) bool { return f.path == p || strings.HasPrefix(f.path, p+"[]") }) {
				if v, found := valueAt(reflect.ValueOf(completed), f.path); found {
					want, ok = v, true
				}
			}
		}
		if !ok {
			continue // an element of an empty list
		}
		if isEmpty(want) {
			if d, ok := derived[f.path]; ok {
				want = reflect.ValueOf(d)
			}
		}
		tok, has := firstSpanOK(row[1])
		if !has {
			if !isEmpty(want) && !strings.Contains(f.path, "[]") {
				t.Errorf("%s: %s defaults to %v but its row gives no default", reference, f.path, show(want))
			}
			continue
		}
		got := reflect.New(f.typ)
		if err := yaml.Unmarshal([]byte(tok), got.Interface()); err != nil {
			t.Errorf("%s: default `%s` of %s is not a %s: %v", reference, tok, f.path, f.typ, err)
			continue
		}
		if !sameValue(got.Elem(), want) {
			t.Errorf("%s: %s is documented to default to `%s`, the code's default is %s", reference, f.path, tok, show(want))
		}
	}

	// Every document: a dotted cloud-config path is a field.
	top := map[string]bool{}
	for _, f := range fields {
		top[strings.FieldsFunc(f.path, func(r rune) bool { return r == '.' || r == '[' })[0]] = true
	}
	pathRe := regexp.MustCompile(`^([A-Za-z]+)((?:\.[A-Za-z0-9]+|\[[0-9]*\])+)`)
	index := regexp.MustCompile(`\[[0-9]*\]`)
	for _, file := range docFiles {
		for _, s := range spans(readDoc(t, file)) {
			m := pathRe.FindStringSubmatch(s)
			if m == nil || !top[m[1]] {
				continue
			}
			p := index.ReplaceAllString(m[0], "[]")
			if _, ok := known[p]; !ok {
				t.Errorf("%s names cloud-config field `%s`, which provider.Config does not have", file, m[0])
			}
		}
	}
}

type cfgField struct {
	path  string
	typ   reflect.Type
	group bool // a struct whose fields have rows of their own
}

var jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

// plainStruct: a struct that YAML fills field by field (not metav1.Duration).
func plainStruct(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return t.Kind() == reflect.Struct && !p.Implements(jsonUnmarshaler) && !p.Implements(textUnmarshaler)
}

// configFields lists the json paths of t's fields: "routes.bridge",
// "loadBalancer.pools", "loadBalancer.pools[].name".
func configFields(t reflect.Type, prefix string, out *[]cfgField) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "-" || tag == "" {
			if f.Anonymous && plainStruct(f.Type) {
				configFields(f.Type, prefix, out)
			}
			continue
		}
		path := tag
		if prefix != "" {
			path = prefix + "." + tag
		}
		switch ft := f.Type; {
		case plainStruct(ft):
			*out = append(*out, cfgField{path: path, typ: ft, group: true})
			configFields(ft, path, out)
		case ft.Kind() == reflect.Slice && plainStruct(ft.Elem()):
			*out = append(*out, cfgField{path: path, typ: ft})
			configFields(ft.Elem(), path+"[]", out)
		default:
			*out = append(*out, cfgField{path: path, typ: ft})
		}
	}
}

// valueAt follows a path of configFields in v; "x[]" is x's first element.
func valueAt(v reflect.Value, path string) (reflect.Value, bool) {
	for seg := range strings.SplitSeq(path, ".") {
		name, list := strings.CutSuffix(seg, "[]")
		found := false
		for i := range v.NumField() {
			tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
			if tag == name {
				v, found = v.Field(i), true
				break
			}
		}
		if !found {
			return reflect.Value{}, false
		}
		if list {
			if v.Len() == 0 {
				return reflect.Value{}, false
			}
			v = v.Index(0)
		}
	}
	return v, true
}

func isEmpty(v reflect.Value) bool {
	if v.Kind() == reflect.Slice || v.Kind() == reflect.Map {
		return v.Len() == 0
	}
	return v.IsZero()
}

func sameValue(a, b reflect.Value) bool {
	if isEmpty(a) && isEmpty(b) {
		return true
	}
	if a.CanConvert(b.Type()) && a.Kind() != reflect.Slice {
		a = a.Convert(b.Type())
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}

func show(v reflect.Value) string {
	b, err := yaml.Marshal(v.Interface())
	if err != nil {
		return fmt.Sprint(v.Interface())
	}
	return strings.TrimSpace(string(b))
}
