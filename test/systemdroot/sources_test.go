package systemdroot

import (
	"slices"
	"testing"
)

func TestParseSources(t *testing.T) {
	oneLine := `# comment
deb http://deb.debian.org/debian bookworm main contrib
deb [arch=amd64 signed-by=/k.gpg] http://security.debian.org/debian-security bookworm-security main # tail
deb-src http://deb.debian.org/debian bookworm main
deb https://packages.example.com/apt cloud-sdk-bookworm main
deb http://deb.debian.org/debian trixie main
`
	got := parseOneLine(oneLine, "bookworm")
	want := []string{
		"deb http://deb.debian.org/debian bookworm main contrib",
		"deb [arch=amd64 signed-by=/k.gpg] http://security.debian.org/debian-security bookworm-security main",
	}
	if !slices.Equal(got, want) {
		t.Errorf("one-line:\n got %q\nwant %q", got, want)
	}

	deb822 := `Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb deb-src
URIs: http://mirror.example/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb
URIs: http://inline.example/debian
Suites: bookworm-backports
Components: main
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 -----END PGP PUBLIC KEY BLOCK-----
`
	got = parseDeb822(deb822, "bookworm")
	want = []string{
		"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main",
		"deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-updates main",
		"deb http://inline.example/debian bookworm-backports main",
	}
	if !slices.Equal(got, want) {
		t.Errorf("deb822:\n got %q\nwant %q", got, want)
	}
}
