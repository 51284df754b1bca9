package bootstraptoken

import (
	"testing"
	"time"

	bootstraputil "k8s.io/cluster-bootstrap/token/util"
)

func TestRoundTrip(t *testing.T) {
	exp := time.Date(2026, 11, 22, 10, 0, 0, 500, time.UTC)
	tok, err := New(derivedID("test", "node-1"), exp)
	if err != nil {
		t.Fatal(err)
	}
	if !bootstraputil.IsValidBootstrapToken(tok.String()) {
		t.Fatalf("%q is not a bootstrap token", tok.ID)
	}
	s := Secret(tok, map[string]string{"a": "b"}, "desc")
	got, ok := FromSecret(s)
	if !ok || got != (Token{ID: tok.ID, Secret: tok.Secret, Expiration: exp.Truncate(time.Second)}) {
		t.Fatalf("round trip: %+v, %v", got, ok)
	}
	if s.Name != "bootstrap-token-"+tok.ID || string(s.Data["auth-extra-groups"]) != Group {
		t.Fatalf("Secret %s groups %q", s.Name, s.Data["auth-extra-groups"])
	}
	SetExpiration(s, exp.Add(time.Hour))
	if got, _ := FromSecret(s); !got.Expiration.Equal(exp.Add(time.Hour).Truncate(time.Second)) || got.Secret != tok.Secret {
		t.Fatalf("after SetExpiration: %+v", got)
	}
	delete(s.Data, "token-secret")
	if _, ok := FromSecret(s); ok {
		t.Fatal("a Secret without its secret part parsed")
	}
}

func TestDerivedID(t *testing.T) {
	for _, tc := range []struct {
		a, b [2]string
		same bool
	}{
		{[2]string{"d", "k"}, [2]string{"d", "k"}, true},
		{[2]string{"d", "k"}, [2]string{"d", "k2"}, false},
		{[2]string{"d", "k"}, [2]string{"e", "k"}, false},
	} {
		if got := derivedID(tc.a[0], tc.a[1]) == derivedID(tc.b[0], tc.b[1]); got != tc.same {
			t.Errorf("DerivedID%v == DerivedID%v: %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}
