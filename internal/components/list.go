package components

import (
	"encoding/json"

	"google.golang.org/protobuf/encoding/protojson"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
)

// MarshalList encodes list as the join config's kubernetesComponents
// value: a JSON array of gatehouse.components.v1.Component in protobuf
// JSON form (docs/joinservice.md).
func MarshalList(list []*componentsv1.Component) (string, error) {
	out := make([]json.RawMessage, 0, len(list))
	for _, c := range list {
		b, err := protojson.Marshal(c)
		if err != nil {
			return "", err
		}
		out = append(out, b)
	}
	b, err := json.Marshal(out)
	return string(b), err
}
