package examples

import (
	"slices"
	"strings"
	"testing"
)

func TestCCMArgs(t *testing.T) {
	args, err := CCMArgs(map[string]string{UnitKubeconfig: "/tmp/x/kc", UnitCloudConfig: "/tmp/x/cc.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"--cloud-provider=libvirt",
		"--cloud-config=/tmp/x/cc.yaml",
		"--kubeconfig=/tmp/x/kc",
		"--authentication-kubeconfig=/tmp/x/kc",
		"--authorization-kubeconfig=/tmp/x/kc",
		"--leader-elect=true",
		"--bind-address=127.0.0.1",
		"--allocate-node-cidrs=true", "--cluster-cidr=10.244.0.0/16", "--configure-cloud-routes=true",
	}
	if !slices.Equal(args, want) {
		t.Fatalf("args =\n%q\nwant\n%q", args, want)
	}
	for _, a := range args {
		for _, bad := range []string{"--leader-elect=false", "--secure-port=0", "--authentication-skip-lookup"} {
			if a == bad {
				t.Errorf("the unit runs the CCM with %s", bad)
			}
		}
	}
}

func TestCCMArgsNeedsEveryFile(t *testing.T) {
	_, err := CCMArgs(map[string]string{UnitKubeconfig: "/tmp/kc"})
	if err == nil || !strings.Contains(err.Error(), UnitCloudConfig) {
		t.Fatalf("err = %v, want one naming %s", err, UnitCloudConfig)
	}
}

func TestExecStart(t *testing.T) {
	for _, tt := range []struct {
		unit string
		want []string
		err  string
	}{
		{"[Service]\nExecStart=/bin/x \\\n  --a=1 \\\n  --b\nRestart=always\n", []string{"/bin/x", "--a=1", "--b"}, ""},
		{"[Service]\nExecStart=/bin/x --a\n--not-this\n", []string{"/bin/x", "--a"}, ""},
		{"[Service]\nRestart=always\n", nil, "no ExecStart"},
		{"ExecStart=/bin/x '--a b'\n", nil, "quoting"},
		{"ExecStart=/bin/x\n", nil, "no arguments"},
	} {
		got, err := ExecStart([]byte(tt.unit))
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: err = %v, want %q", tt.unit, err, tt.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("%q: %q, %v; want %q", tt.unit, got, err, tt.want)
		}
	}
}

func TestUnitSandbox(t *testing.T) {
	s, err := CCMSandbox()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Bounding, []string{"CAP_NET_ADMIN", "CAP_NET_RAW"}) || !s.NoNewPrivileges {
		t.Fatalf("the shipped unit's sandbox is %+v, want CAP_NET_ADMIN CAP_NET_RAW and no new privileges", s)
	}
	got := s.Wrap([]string{"/bin/ccm", "--v=2"})
	want := []string{"setpriv", "--bounding-set", "-all,+net_admin,+net_raw", "--inh-caps", "-all,+net_admin,+net_raw",
		"--ambient-caps", "-all,+net_admin,+net_raw", "--no-new-privs", "--", "/bin/ccm", "--v=2"}
	if !slices.Equal(got, want) {
		t.Fatalf("Wrap =\n%q\nwant\n%q", got, want)
	}
	for _, tt := range []struct{ unit, err string }{
		{"[Service]\nExecStart=/bin/x --a\n", "no CapabilityBoundingSet"},
		{"[Service]\nCapabilityBoundingSet=~CAP_SYS_ADMIN\n", "want names like"},
	} {
		if _, err := UnitSandbox([]byte(tt.unit)); err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%q: err = %v, want %q", tt.unit, err, tt.err)
		}
	}
}
