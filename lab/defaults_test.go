package lab

// The default lab's addresses (Addressing's zero value), under the names
// of the constants they were before up --subnet moved them: the tests
// written against those compare against the defaults.
var (
	defaults    = Addressing{}
	Gateway     = defaults.Gateway()
	VIPPool     = defaults.VIPPool()
	RouterAddr  = defaults.RouterAddr()
	Subnet      = DefaultSubnet
	ClusterCIDR = DefaultPodCIDR
)
