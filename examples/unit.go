package examples

import (
	"bufio"
	"bytes"
	"fmt"
	"slices"
	"strings"
)

// Paths of the files the unit's ExecStart names.
const (
	ConfigDir       = "/etc/libvirt-cloud-controller-manager"
	UnitKubeconfig  = ConfigDir + "/kubeconfig"
	UnitCloudConfig = ConfigDir + "/cloud-config.yaml"
)

// CCMArgs returns the CCM's arguments exactly as the unit's ExecStart gives
// them (without the binary), with every path under ConfigDir replaced by
// files[path], so that a lab or a test runs the CCM as shipped with files
// of its own. A path of the unit missing from files is an error.
func CCMArgs(files map[string]string) ([]string, error) {
	words, err := ExecStart(Unit)
	if err != nil {
		return nil, err
	}
	args := slices.Clone(words[1:])
	for i, a := range args {
		name, value, hasValue := strings.Cut(a, "=")
		if !hasValue || !strings.HasPrefix(value, ConfigDir+"/") {
			continue
		}
		local, ok := files[value]
		if !ok {
			return nil, fmt.Errorf("the unit's %s names %s: say where that file is", name, value)
		}
		args[i] = name + "=" + local
	}
	return args, nil
}

// ExecStart reads the ExecStart line of a systemd unit, joining lines
// continued with a backslash, and splits it into words: the binary, then its
// arguments. The unit quotes nothing, and this parser refuses quotes rather
// than misread them. Tests read the unit a package installed with it.
func ExecStart(unit []byte) ([]string, error) {
	var line strings.Builder
	found := false
	sc := bufio.NewScanner(bytes.NewReader(unit))
	for sc.Scan() {
		text := strings.TrimSpace(sc.Text())
		if !found {
			rest, ok := strings.CutPrefix(text, "ExecStart=")
			if !ok {
				continue
			}
			found, text = true, rest
		}
		cont := strings.HasSuffix(text, `\`)
		line.WriteString(strings.TrimSuffix(text, `\`))
		line.WriteByte(' ')
		if !cont {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("no ExecStart in the unit")
	}
	if strings.ContainsAny(line.String(), `"'$%`) {
		return nil, fmt.Errorf("ExecStart uses quoting or specifiers this parser does not read: %s", line.String())
	}
	words := strings.Fields(line.String())
	if len(words) < 2 {
		return nil, fmt.Errorf("ExecStart has no arguments: %q", line.String())
	}
	return words, nil
}
