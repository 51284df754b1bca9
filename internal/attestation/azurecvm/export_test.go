package azurecvm

// What the external tests use of the HCL report's format.
var (
	ParseHCLReport   = parseHCLReport
	ParseRuntimeData = parseRuntimeData
	ReadHCLReport    = readHCLReport
	ParseTHIM        = parseTHIM
)

// The paravisor's NV indices, which the tests' emulated paravisor serves.
const (
	HCLReportNV   = hclReportNV
	HCLUserDataNV = hclUserDataNV
)
