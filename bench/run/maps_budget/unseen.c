#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <fcntl.h>
#include <unistd.h>
static char buf[1<<16];
static long count_maps(void){int fd=open("/proc/self/maps",O_RDONLY);long n=0;ssize_t r;while((r=read(fd,buf,sizeof buf))>0)for(ssize_t i=0;i<r;i++)n+=buf[i]=='\n';close(fd);return n;}
static long raw_mprotect(void *a, size_t l, int p){long r;asm volatile("syscall":"=a"(r):"0"(10L),"D"(a),"S"(l),"d"((long)p):"rcx","r11","memory");return r;}
int main(int argc,char**argv){
  long left = atol(argv[1]); int nb = atoi(argv[2]);
  size_t sz = 256<<10;
  /* the arena takes many mappings: copies into blocks, half of them freed (free table keeps mappings) */
  char *src = malloc(sz); memset(src, 5, sz);
  char **b = calloc(nb, sizeof *b);
  for (int i=0;i<nb;i++){ b[i]=malloc(sz); memcpy(b[i],src,sz); }
  for (int i=0;i<nb;i+=2) free(b[i]);
  long have = count_maps();
  FILE *f=fopen("/proc/sys/vm/max_map_count","r"); long max; if(fscanf(f,"%ld",&max)!=1)return 2; fclose(f);
  long want = max - left - have;
  char *r = mmap(NULL,(2*want+2)*4096,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE,-1,0);
  for (long i=0;i<want/2;i++) if (raw_mprotect(r+(2*i+1)*4096,4096,PROT_READ)) break;
  long before = count_maps(); int nul=0;
  for (int i=0;i<400;i++){ char *p=malloc(2*sz); if(!p){nul++;continue;} memcpy(p,src,sz); memcpy(p+sz,src,sz); }
  printf("arena copies %d; maps before %ld after %ld of %ld; %d of 400 mallocs NULL\n", nb, before, count_maps(), max, nul);
  return 0;
}
