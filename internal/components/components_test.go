package components

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"

	componentsv1 "github.com/gatehouse-dev/gatehouse/api/components/v1"
)

func TestValidate(t *testing.T) {
	good := fmt.Sprintf("sha256:%x", sha256.Sum256([]byte("x")))
	for _, tc := range []struct {
		c    *componentsv1.Component
		want string
	}{
		{&componentsv1.Component{Url: "ftp://x/y", Hash: good, InstallPath: "/usr/bin/y"}, "scheme"},
		{&componentsv1.Component{Url: "https://x/y", Hash: "sha256:abc", InstallPath: "/usr/bin/y"}, "64 lowercase hex"},
		{&componentsv1.Component{Url: "https://x/y", Hash: strings.ToUpper(good), InstallPath: "/usr/bin/y"}, "64 lowercase hex"},
		{&componentsv1.Component{Url: "https://x/y", Hash: "sha512:" + good[7:], InstallPath: "/usr/bin/y"}, "sha256"},
		{&componentsv1.Component{Url: "https://x/y", Hash: good, InstallPath: "usr/bin/y"}, "absolute"},
		{&componentsv1.Component{Url: "https://x/y", Hash: good, InstallPath: "/usr/../etc/y"}, "clean"},
		{&componentsv1.Component{Url: "https://x/y", Hash: good, InstallPath: "/"}, "other than /"},
	} {
		err := Validate(tc.c)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%v) = %v, want an error containing %q", tc.c, err, tc.want)
		}
	}
}

func TestParseDataURL(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
		err  bool
	}{
		{"data:,hello%20world", "hello world", false},
		{"data:text/plain;charset=utf-8,hi", "hi", false},
		{"data:;base64,aGk=", "hi", false},
		{"data:;base64,aGk", "hi", false},
		{"data:;base64,!!", "", true},
		{"data:hi", "", true},
		{"http://x", "", true},
		{"data:,%zz", "", true},
	} {
		got, err := ParseDataURL(tc.in)
		if (err != nil) != tc.err || string(got) != tc.want {
			t.Errorf("ParseDataURL(%q) = %q, %v", tc.in, got, err)
		}
	}
}

func FuzzParseDataURL(f *testing.F) {
	for _, s := range []string{"data:,x", "data:;base64,aGk=", "data:text/plain;base64,%41%41==", "data:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out, err := ParseDataURL(s)
		if err != nil && out != nil {
			t.Fatal("data and an error")
		}
	})
}
