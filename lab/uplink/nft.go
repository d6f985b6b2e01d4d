package uplink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const (
	// Table is our nftables table (inet, in the host's namespace).
	Table = "labcloud"
	// Tag is the comment on each rule we add to another table's chain
	// (iptables -L shows it as /* labcloud-uplink */): Remove deletes
	// exactly those.
	Tag = "labcloud-uplink"
	// dockerUser is where Docker says a user's forwarding rules go: its
	// FORWARD chain jumps there first, and Docker keeps it across restarts.
	dockerUser = "DOCKER-USER"
)

// addNAT makes our table in ns: masquerade for the lab's IPv4 sources
// leaving by any link but the uplink, forwarding out of the lab accepted
// and into it only for answers. A table of our own cannot override another's drop
// (Docker's FORWARD policy), so each other table's forward chains get
// accepts too. It returns what the user should know.
func addNAT(ns netns.NsHandle, sources []netip.Prefix) ([]string, error) {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return nil, err
	}
	t := c.AddTable(&nftables.Table{Name: Table, Family: nftables.TableFamilyINet})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	for _, src := range sources {
		c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: masquerade(src, HostLink)})
	}
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	// Out of the lab, anything; into it, only answers: the host forwards
	// for the lab, never for a LAN peer (or a container) routing the
	// lab's addresses via the host. A drop here is final whatever other
	// tables accept; the host's own traffic to the lab is not forwarded.
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: acceptLink(expr.MetaKeyIIFNAME, HostLink)})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: answersInto(HostLink)})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: dropInto(HostLink)})
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("nftables table inet %s: %w", Table, err)
	}
	notes, err := OpenForwarding(ns, HostLink)
	if legacy := legacyTables(ns); legacy != "" {
		notes = append(notes, fmt.Sprintf("iptables-legacy tables are in use (%s): if their FORWARD chain drops, the lab cannot reach out; add: iptables-legacy -I FORWARD -i %[2]s -j ACCEPT; iptables-legacy -I FORWARD -o %[2]s -j ACCEPT", legacy, HostLink))
	}
	return notes, err
}

// OpenForwarding lets traffic in and out of link through every forward
// base chain of another table in ns (Docker's, iptables-nft's, libvirt's
// rejects for addresses outside its network), with tagged accepts at the
// chain's head, or at the head of Docker's DOCKER-USER where that table
// has one. It returns a note per chain opened; a chain that already has
// our accepts is left alone.
func OpenForwarding(ns netns.NsHandle, link string) ([]string, error) {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return nil, err
	}
	chains, err := c.ListChains()
	if err != nil {
		return nil, fmt.Errorf("list nftables chains: %w", err)
	}
	var notes []string
	for _, ch := range forwardChains(chains) {
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return notes, fmt.Errorf("rules of %s: %w", chainName(ch), err)
		}
		if len(tagged(rules)) > 0 {
			continue
		}
		for _, key := range []expr.MetaKey{expr.MetaKeyOIFNAME, expr.MetaKeyIIFNAME} {
			c.InsertRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: acceptLink(key, link), UserData: userdata.AppendString(nil, userdata.TypeComment, Tag)})
		}
		notes = append(notes, fmt.Sprintf("accepted %s's forwarded traffic in %s (tagged %s)", link, chainName(ch), Tag))
	}
	if err := c.Flush(); err != nil {
		return notes, fmt.Errorf("accept %s in other tables' forward chains: %w", link, err)
	}
	return notes, nil
}

// forwardChains are the chains OpenForwarding opens: each IP table's
// forward filter base chains (not ours), or its DOCKER-USER instead.
func forwardChains(chains []*nftables.Chain) []*nftables.Chain {
	var out []*nftables.Chain
	for _, ch := range chains {
		if ch.Hooknum == nil || *ch.Hooknum != *nftables.ChainHookForward || ch.Type != nftables.ChainTypeFilter ||
			ch.Table.Name == Table || !ipFamily(ch.Table.Family) {
			continue
		}
		target := ch
		for _, o := range chains {
			if o.Name == dockerUser && o.Table.Name == ch.Table.Name && o.Table.Family == ch.Table.Family {
				target = o
			}
		}
		out = append(out, target)
	}
	return out
}

func ipFamily(f nftables.TableFamily) bool {
	return f == nftables.TableFamilyIPv4 || f == nftables.TableFamilyIPv6 || f == nftables.TableFamilyINet
}

func chainName(ch *nftables.Chain) string {
	fam := map[nftables.TableFamily]string{nftables.TableFamilyIPv4: "ip", nftables.TableFamilyIPv6: "ip6", nftables.TableFamilyINet: "inet"}[ch.Table.Family]
	return fmt.Sprintf("%s %s %s", fam, ch.Table.Name, ch.Name)
}

// tagged are the rules carrying our Tag.
func tagged(rules []*nftables.Rule) []*nftables.Rule {
	var out []*nftables.Rule
	for _, r := range rules {
		if s, ok := userdata.GetString(r.UserData, userdata.TypeComment); ok && s == Tag {
			out = append(out, r)
		}
	}
	return out
}

// removeNAT deletes our table and our tagged rules in every other table.
func removeNAT(ns netns.NsHandle) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return err
	}
	if t, err := c.ListTableOfFamily(Table, nftables.TableFamilyINet); err == nil {
		c.DelTable(t)
	} else if !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("nftables table inet %s: %w", Table, err)
	}
	chains, err := c.ListChains()
	if err != nil {
		return fmt.Errorf("list nftables chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name == Table && ch.Table.Family == nftables.TableFamilyINet {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return fmt.Errorf("rules of %s: %w", chainName(ch), err)
		}
		for _, r := range tagged(rules) {
			if err := c.DelRule(r); err != nil {
				return err
			}
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("remove the uplink's nftables rules: %w", err)
	}
	return nil
}

// legacyTables names the iptables-legacy tables in ns, which nftables
// cannot see: "" when there are none.
func legacyTables(ns netns.NsHandle) string {
	var names string
	_ = inNS(ns, func() error {
		b, err := os.ReadFile("/proc/net/ip_tables_names")
		names = strings.Join(strings.Fields(string(b)), ", ")
		return err
	})
	return names
}

// masquerade is `meta nfproto ipv4 ip saddr src oifname != link masquerade`.
func masquerade(src netip.Prefix, link string) []expr.Any {
	mask := make([]byte, 4)
	binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-src.Bits()))
	a := src.Masked().Addr().As4()
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]},
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(link)},
		&expr.Masq{},
	}
}

// acceptLink is `iifname link accept` or `oifname link accept` (key).
func acceptLink(key expr.MetaKey, link string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(link)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
}

// answersInto is `oifname link ct state established,related accept`.
func answersInto(link string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(link)},
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
}

// dropInto is `oifname link drop`.
func dropInto(link string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(link)},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}
}

// ifname is an interface name as nftables and iptables-nft compare it.
func ifname(name string) []byte { return append([]byte(name), 0) }
