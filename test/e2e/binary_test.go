package e2e

import (
	"debug/elf"
	"strings"
	"testing"
)

// TestCCMBinaryLinksNoTemplateExecutor: text/template's executor calls
// methods by name, so a binary that links it keeps every exported method of
// every type it links, called or not: the linker cannot tell which a
// template might name. For the CCM that was 25 MB more text (70 MB instead of
// 45), most of it mapped at start. gRPC links the executor through
// golang.org/x/net/trace (html/template) unless built with the grpcnotrace
// tag, which `make build` passes; a dependency that links it again fails
// here.
func TestCCMBinaryLinksNoTemplateExecutor(t *testing.T) {
	f, err := elf.Open(env.ccmBin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatalf("%s: %v (make build must not strip the symbol table)", env.ccmBin, err)
	}
	var linked []string
	for _, s := range syms {
		if s.Name == "text/template.(*state).evalField" || strings.HasPrefix(s.Name, "golang.org/x/net/trace.") {
			linked = append(linked, s.Name)
		}
	}
	if len(linked) > 0 {
		t.Errorf("%s links text/template's executor or golang.org/x/net/trace (%d symbols, e.g. %s): every exported method stays in the binary",
			env.ccmBin, len(linked), linked[0])
	}
}
