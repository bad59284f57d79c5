// yamlprobe: the ground truth for the TypeScript YAML reader. It reads
// {"docs": [yaml...], "scalars": [yaml scalar...]} on stdin and prints, for each doc,
// what github.com/ghodss/yaml (over the vendored gopkg.in/yaml.v2) turns it into, and
// for each scalar how ghodss renders it into a Go string field.
//
// test/yaml/golden.ts builds it inside adnanh/webhook 2.8.0's source tree (go build -overlay,
// -mod=vendor, offline), so that it links exactly the YAML libraries adnanh ships.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/ghodss/yaml"
)

type input struct {
	Docs    []string `json:"docs"`
	Scalars []string `json:"scalars"`
}

type docResult struct {
	JSON *string `json:"json,omitempty"`
	Err  *string `json:"err,omitempty"`
}

type scalarResult struct {
	Str *string `json:"str,omitempty"`
	Err *string `json:"err,omitempty"`
}

// toJSON is ghodss's YAMLToJSON, with yaml.v2's internal panics (it has some: "should not
// happen") reported as errors, so that one bad input does not end the probe.
func toJSON(d string) (j []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return yaml.YAMLToJSON([]byte(d))
}

type stringTarget struct {
	V string `json:"v"`
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		panic(err)
	}
	out := struct {
		Docs    []docResult    `json:"docs"`
		Scalars []scalarResult `json:"scalars"`
	}{}
	for _, d := range in.Docs {
		j, err := toJSON(d)
		if err != nil {
			e := err.Error()
			out.Docs = append(out.Docs, docResult{Err: &e})
		} else {
			s := string(j)
			out.Docs = append(out.Docs, docResult{JSON: &s})
		}
	}
	for _, s := range in.Scalars {
		var t stringTarget
		if err := yaml.Unmarshal([]byte("v: "+s), &t); err != nil {
			e := err.Error()
			out.Scalars = append(out.Scalars, scalarResult{Err: &e})
		} else {
			v := t.V
			out.Scalars = append(out.Scalars, scalarResult{Str: &v})
		}
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		panic(err)
	}
}
