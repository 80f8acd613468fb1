/* A real MPI rank for the test bed: allreduce of rank+1 over MPI_COMM_WORLD, printed with the
 * host. With an argument N, rank N exits with status 3 before the barrier the others wait in. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int rank, size, mine, sum = 0;
    char host[256] = "";
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host - 1);
    mine = rank + 1;
    MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d of %d on %s sum %d\n", rank, size, host, sum);
    fflush(stdout);
    if (argc > 1 && rank == atoi(argv[1])) exit(3);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
    return 0;
}
