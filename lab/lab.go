// Package lab is the simulated cloud: in a network namespace of its own it
// runs libvirtd, a routed libvirt network, etcd, kube-apiserver,
// kube-controller-manager and the libvirt CCM, and boots small guests that
// run lab-node. lab/up brings it up; everything it makes is recorded in
// the State so that Down removes exactly that, and Status reads it.
package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Fixed names of the lab (its addresses are Addressing's). One lab per
// host: libvirtd's sockets have fixed paths.
const (
	Netns       = "labcloud"
	NetworkName = "labcloud"
	Bridge      = "lcbr0"
	APIPort     = 6443
	NodePrefix  = "lab-node-"
	labURI      = "qemu:///system"                   // the lab's libvirtd
	labHost     = "lab-host"                         // the lab's one hypervisor host, also its zone
	CCMProcess  = "libvirt-cloud-controller-manager" // the CCM's key in State.Pids
)

// DefaultStateDir holds the running lab's files; removed by Down.
var DefaultStateDir = "/var/lib/labcloud/lab"

// CacheDir keeps what is slow to make (image, binaries) across labs.
func CacheDir() string {
	if d := os.Getenv("LABCLOUD_CACHE"); d != "" {
		return d
	}
	return "/var/cache/labcloud"
}

// State is what a running lab is made of.
type State struct {
	Dir        string `json:"dir"`
	Netns      string `json:"netns"`
	Kubeconfig string `json:"kubeconfig"`
	APIServer  string `json:"apiServer"`
	// HostKubeconfig reaches the API server from the host, through the
	// forwarder on the host's loopback at HostAPIServer.
	HostKubeconfig string         `json:"hostKubeconfig,omitempty"`
	HostAPIServer  string         `json:"hostAPIServer,omitempty"`
	Tools          string         `json:"tools"`
	Pids           map[string]int `json:"pids"`
	// CCMCommand is the CCM's command line (binary first) as the lab
	// started it: a restart (labcloud chaos) runs exactly this again.
	CCMCommand []string `json:"ccmCommand,omitempty"`
	Nodes      []string `json:"nodes"`
	Light      bool     `json:"light,omitempty"`
	// IPFamily is the cluster's (up --ip-family); empty in a state written
	// before it was recorded, which was IPv4.
	IPFamily IPFamily `json:"ipFamily,omitempty"`
	// Addressing is where its IPv4 addresses are (up --subnet,
	// --pod-cidr); zero, the defaults, in a state written before.
	Addressing Addressing `json:"addressing"`
	// InsecureRegistries are pulled from over plain HTTP (up
	// --insecure-registry).
	InsecureRegistries []string `json:"insecureRegistries,omitempty"`
	// Router says the LAN router (FRR) runs and the CCM peers with it.
	Router bool `json:"router,omitempty"`
	// Routed says each host is on a segment of its own (up --routed).
	Routed bool `json:"routed,omitempty"`
	// Hosts are the lab's hypervisor hosts (up --hosts), the first the
	// lab's own namespace; see LabHosts.
	Hosts []Host `json:"hosts,omitempty"`
	// Snapshot is the snapshot the lab was restored from; empty when it
	// booted.
	Snapshot string    `json:"snapshot,omitempty"`
	Steps    []Step    `json:"steps"`
	Started  time.Time `json:"started"`
}

// Step is one timed step of up (lab/up).
type Step struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
}

// FirstAnswerStep is the step that ends up: a LoadBalancer Service in
// front of a real pod, answered through its VIP.
const FirstAnswerStep = "first answer through a LoadBalancer VIP"

// NewState is the record of a lab of opts (Validate has checked them)
// before anything is made: its addresses and its hosts.
func NewState(opts Options) *State {
	st := &State{Dir: opts.Dir, Netns: Netns, Pids: map[string]int{}, Light: opts.Light, IPFamily: opts.IPFamily.orIPv4(), Addressing: opts.addressing(), InsecureRegistries: opts.InsecureRegistries, Started: time.Now()}
	if !opts.Light {
		st.Hosts = labHosts(opts.Dir, opts.Hosts, st.Addressing)
		if opts.Routed {
			st.Routed = true
			routeHosts(st.Hosts, st.Addressing)
		}
	}
	return st
}

func statePath(dir string) string { return filepath.Join(dir, "state.json") }

// LoadState reads the state of the lab in dir.
func LoadState(dir string) (*State, error) {
	data, err := os.ReadFile(statePath(dir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no lab is up (no %s); run labcloud up", statePath(dir))
	}
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("lab state %s: %w", statePath(dir), err)
	}
	return &s, nil
}

// Save writes the state file, atomically.
func (s *State) Save() error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := statePath(s.Dir) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, statePath(s.Dir))
}

// addressing is the lab's addresses of its family.
func (s *State) addressing() Addresses { return s.Addressing.Of(s.IPFamily) }

// nodeName and nodeMAC give guest i (1-based) its fixed identity.
func nodeName(i int) string { return fmt.Sprintf("%s%d", NodePrefix, i) }
func nodeMAC(i int) string  { return fmt.Sprintf("52:54:00:7c:%02x:%02x", i>>8, i&0xff) }

// Guest is guest i's (1-based) fixed identity in a full lab: its name, its
// MAC and the host it runs on (round robin).
func (s *State) Guest(i int) (name, mac string, on Host) {
	return nodeName(i), nodeMAC(i), s.Hosts[hostOfGuest(i, len(s.Hosts))-1]
}

// AdminClient is a client of the lab's API server with kubeconfig.
func AdminClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 100, 200
	return kubernetes.NewForConfig(cfg)
}
