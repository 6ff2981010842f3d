// Package v20170312 declares only what flannel's tencent-vpc backend calls; each call fails.
package v20170312

import "errors"

// errUnavailable is what every call returns: this build has no Tencent Cloud client.
var errUnavailable = errors.New("tencent-vpc backend not built in: the Tencent Cloud VPC SDK is not available to this build")

// Client is never usable.
type Client struct{}

// NewClientWithSecretId fails: there is no SDK behind it.
func NewClientWithSecretId(_, _, _ string) (*Client, error) { return nil, errUnavailable }

// Filter narrows a route table listing.
type Filter struct {
	Name   *string
	Values []*string
}

// Route is one entry of a route table.
type Route struct {
	RouteId              *uint64
	DestinationCidrBlock *string
	GatewayType          *string
	GatewayId            *string
	RouteType            *string
	Enabled              *bool
}

// RouteTable is a route table and its routes.
type RouteTable struct {
	RouteTableId *string
	RouteSet     []*Route
}

// DescribeRouteTablesRequest lists route tables.
type DescribeRouteTablesRequest struct{ Filters []*Filter }

// DescribeRouteTablesResponse answers DescribeRouteTablesRequest.
type DescribeRouteTablesResponse struct {
	Response *struct{ RouteTableSet []*RouteTable }
}

// DeleteRoutesRequest deletes routes from a table.
type DeleteRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

// CreateRoutesRequest adds routes to a table.
type CreateRoutesRequest struct {
	RouteTableId *string
	Routes       []*Route
}

// NewDescribeRouteTablesRequest returns an empty request.
func NewDescribeRouteTablesRequest() *DescribeRouteTablesRequest { return &DescribeRouteTablesRequest{} }

// NewDeleteRoutesRequest returns an empty request.
func NewDeleteRoutesRequest() *DeleteRoutesRequest { return &DeleteRoutesRequest{} }

// NewCreateRoutesRequest returns an empty request.
func NewCreateRoutesRequest() *CreateRoutesRequest { return &CreateRoutesRequest{} }

// DescribeRouteTables fails.
func (*Client) DescribeRouteTables(*DescribeRouteTablesRequest) (*DescribeRouteTablesResponse, error) {
	return nil, errUnavailable
}

// DeleteRoutes fails.
func (*Client) DeleteRoutes(*DeleteRoutesRequest) (struct{}, error) { return struct{}{}, errUnavailable }

// CreateRoutes fails.
func (*Client) CreateRoutes(*CreateRoutesRequest) (struct{}, error) { return struct{}{}, errUnavailable }
