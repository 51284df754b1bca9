package protostrict

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	joinservicev1 "github.com/gatehouse-dev/gatehouse/api/joinservice/v1"
)

// withUnknown appends field 999 (varint 1) to a marshalled message.
func withUnknown(b []byte) []byte {
	b = protowire.AppendTag(b, 999, protowire.VarintType)
	return protowire.AppendVarint(b, 1)
}

func TestCheckUnknown(t *testing.T) {
	known, err := proto.Marshal(&joinservicev1.IssueJoinTicketRequest{DiskUuid: "x", IsControlPlane: true})
	if err != nil {
		t.Fatal(err)
	}
	nested, err := proto.Marshal(&joinservicev1.IssueJoinTicketResponse{ControlPlaneFiles: []*joinservicev1.ControlPlaneFile{{Name: "ca.crt"}}})
	if err != nil {
		t.Fatal(err)
	}
	// A nested message with an unknown field: ControlPlaneFile (field 11) holding field 999.
	inner := withUnknown(mustMarshal(t, &joinservicev1.ControlPlaneFile{Name: "ca.key"}))
	nestedUnknown := protowire.AppendTag(nil, 11, protowire.BytesType)
	nestedUnknown = protowire.AppendBytes(nestedUnknown, inner)

	for _, tt := range []struct {
		name    string
		data    []byte
		msg     proto.Message
		wantErr string
	}{
		{"known fields only", known, &joinservicev1.IssueJoinTicketRequest{}, ""},
		{"unknown top-level field is refused", withUnknown(known), &joinservicev1.IssueJoinTicketRequest{}, "IssueJoinTicketRequest: has fields"},
		{"nested known fields", nested, &joinservicev1.IssueJoinTicketResponse{}, ""},
		{"unknown field in a repeated message is refused", nestedUnknown, &joinservicev1.IssueJoinTicketResponse{}, "IssueJoinTicketResponse.control_plane_files[0]: has fields"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := proto.Unmarshal(tt.data, tt.msg); err != nil {
				t.Fatal(err)
			}
			err := CheckUnknown(tt.msg)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("CheckUnknown = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
